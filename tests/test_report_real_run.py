"""``python -m launch report`` on one real 2-rank M4 launch (a session fixture of this file): the page inlines
every figure ``run_figures`` draws for the run and shows the run's own numbers from summary.json and
metrics.json; its communication table and CSV downloads carry the cost model's bytes (``estimate``, computed
here) next to the measured ones; a comparison against a synthetic failed run puts the same numbers in
column A; and a headless chromium (skipped when missing) opens the page with the network blocked and saves a
screenshot into ``tmp_path``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from report_page import Page, assert_self_contained, failed_run

import launch
from hyper_parallel.run_files import METRICS_FILE, SUMMARY_FILE
from hyper_parallel.viz import run_figures
from launch.cli import main as cli_main
from launch.report import REPORT_FILE

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def real_run(tmp_path_factory) -> Path:
    """The one real launch of this file: M4 on 2 ranks, 2 steps."""
    run_dir = tmp_path_factory.mktemp("report") / "m4"
    result = launch.run("M4", world_size=2, dp_shard=2, steps=2, out=run_dir, timeout=240)
    assert result.ok, result.error
    return run_dir


@pytest.fixture(scope="session")
def real_report(real_run) -> tuple[Path, Page]:
    assert cli_main(["report", str(real_run)]) == 0
    path = real_run / REPORT_FILE
    return path, Page(path.read_text(encoding="utf-8"))


@pytest.mark.distributed
def test_report_of_a_real_run_inlines_every_figure_and_the_run_numbers(real_run, real_report):
    path, page = real_report
    assert path == (real_run / REPORT_FILE).resolve()
    assert_self_contained(page)
    drawn = run_figures(real_run)
    inlined = page.figures()
    assert list(inlined) == [
        n for n in ("numerics", "mesh", "placements", "placement_overview", "timeline", "comm_volume") if n in drawn
    ]
    assert set(inlined) == set(drawn) and len(drawn) == 6
    for name, src in inlined.items():
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n", name

    summary = json.loads((real_run / SUMMARY_FILE).read_text())
    metrics = json.loads((real_run / METRICS_FILE).read_text())
    assert page.find("span", id="verdict", data_ok="true")
    assert {name: int(text) for name, text in page.degree_cells.items()} == summary["degrees"] == metrics["degrees"]
    assert summary["losses"] == metrics["losses"] and len(metrics["losses"]) == 2
    for key, values in (
        ("loss", metrics["losses"]),
        ("reference_loss", metrics["reference_losses"]),
        ("step_time", metrics["step_times"]),
    ):
        for step, value in enumerate(values):
            exact, shown = page.cells[(key, step)]
            assert float(exact) == value and float(shown) == pytest.approx(value, abs=1e-3), (key, step)
    for key in ("max_abs_diff", "max_param_diff"):
        exact, shown = page.cells[(key, None)]
        assert float(exact) == summary[key] == metrics[key] and float(shown) == pytest.approx(summary[key], rel=1e-3)
    run_text = page.text_in("run")
    assert "FSDP only" in run_text and "M4 | dense" not in run_text and "FSDP2 only" in run_text  # matrix row cells
    assert "python -m launch run M4 --world 2 --dp-shard 2 --steps 2" in run_text
    ratios = [text for key, _, text in page.cell_list if key == "ratio"]
    assert ratios == ["1.00", "1.00"]  # FSDP: all-gathers and reduce-scatters at exactly fully_shard's minimum

    log_texts = [(text, tags) for text, tags, _ in page.texts if "[progress]" in text]
    assert log_texts and all("details" in tags for _, tags in log_texts)  # rank 0's lines, folded
    assert {a["data-rank"] for a in page.find("details")} == {"0", "1"}


@pytest.mark.distributed
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_report_renders_offline_in_headless_chromium(real_report, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    path, page_parsed = real_report
    url = path.as_uri()
    screenshot = tmp_path / "report.png"
    requested = []

    def only_the_file(route):
        if route.request.url == url:
            route.continue_()
        else:
            requested.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda request: request.url != url and requested.append(request.url))
            page.route("**/*", only_the_file)
            page.goto(url, wait_until="load")
            images = page.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])")
            page.screenshot(path=str(screenshot), full_page=True)
            log_shown = (
                "[document.querySelector('details.log pre').checkVisibility(), "
                "document.querySelector('details.log').getBoundingClientRect().height]"
            )
            on_screen = page.evaluate(log_shown)
            page.emulate_media(media="print")
            on_paper = page.evaluate(log_shown)
        finally:
            browser.close()
    assert requested == []
    assert len(images) == len(page_parsed.figures()) == 6
    assert all(complete and width > 0 for _, complete, width in images), images
    assert not on_screen[0] and on_paper[0] and on_paper[1] > on_screen[1]  # folded on screen, unfolded on paper
    assert screenshot.stat().st_size > 50_000


def _csv_of(page: Page, filename: str) -> list[dict]:
    """The rows of the page's ``data:text/csv`` download named ``filename``."""
    import csv
    import io

    link = next(a for a in page.find("a") if a.get("data-csv") == filename)
    assert link["download"] == filename and link["href"].startswith("data:text/csv;base64,")
    return list(csv.DictReader(io.StringIO(base64.b64decode(link["href"].split(",", 1)[1]).decode())))


@pytest.mark.distributed
def test_report_summary_first_cost_model_next_to_every_collective_and_csv(real_run, real_report):
    """M4 on 2 ranks (FSDP over dp_shard=2): every traced (op, group) of rank 0 has the cost model's bytes
    (estimate(recipe_model("M4"), dims), computed here) next to it and they are equal; the tables download
    as CSV with the same numbers; the first section is the summary, which names the layout at 512 ranks
    with the planner's own step time (review_layouts on dp_shard=512, computed here)."""
    from hyper_parallel import ParallelDims
    from hyper_parallel.cost_model import estimate, get_model, recipe_model
    from hyper_parallel.cost_model.hardware import DEFAULT_HARDWARE
    from hyper_parallel.cost_model.review import review_layouts

    _, page = real_report
    dims = ParallelDims(world_size=2, dp_shard=2)
    model = estimate(recipe_model("M4"), dims).by_op_group()
    measured = [float(v) for key, v, _ in page.cell_list if key == "measured_bytes"]
    predicted = [float(v) for key, v, _ in page.cell_list if key == "predicted_bytes"]
    assert sorted(predicted) == sorted(model.values()) and measured == predicted
    rows = _csv_of(page, "communication.csv")
    assert {(r["op"], r["group"]): float(r["cost_model_bytes"]) for r in rows} == model
    assert [float(r["measured_bytes"]) for r in rows] == measured
    losses = json.loads((real_run / METRICS_FILE).read_text())["losses"]
    assert [float(r["loss"]) for r in _csv_of(page, "losses.csv")] == losses
    sections = [a.get("id") for a in page.find("section")]
    assert sections[0] == "summary"
    summary = page.text_in("summary")
    assert "2 of 2 (op, group) totals on rank 0 equal the cost model's bytes" in summary
    at_512 = review_layouts(
        get_model("llama-8b-like"), [ParallelDims(world_size=512, dp_shard=512)], 8, DEFAULT_HARDWARE
    )[0]
    assert (
        "llama-8b-like on 512 ranks as dp_shard=512" in summary and f"{at_512.step.seconds:.2f} s per step" in summary
    )


@pytest.mark.distributed
def test_compare_two_runs_side_by_side(real_run, real_report, tmp_path):
    """A real M4 run against a failed one: facts in two columns, rank 0's collectives of A measured and
    predicted as in A's own report, none for B (no traces)."""
    failed = failed_run(tmp_path / "failed")
    out = tmp_path / "cmp.html"
    assert cli_main(["report", "--compare", str(real_run), str(failed), "--out", str(out)]) == 0
    page = Page(out.read_text(encoding="utf-8"))
    assert all(a[k].startswith(("data:", "#")) for _, a, _ in page.tags for k in ("src", "href") if k in a)
    verdicts = [t for t, _, attrs in page.texts if any(a.get("data-run") for a in attrs) and t in ("PASSED", "FAILED")]
    assert verdicts == ["PASSED", "FAILED"]
    _, report = real_report
    mine = [float(v) for key, v, _ in report.cell_list if key == "measured_bytes"]
    assert [float(v) for key, v, _ in page.cell_list if key == "measured_a"] == mine
    assert [float(v) for key, v, _ in page.cell_list if key == "predicted_a"] == mine
    assert all(v is None for key, v, _ in page.cell_list if key in ("measured_b", "predicted_b"))
    assert len(_csv_of(page, "comparison.csv")) == len(mine)


@pytest.mark.distributed
def test_workbook_report_embeds_the_shown_figures_and_names_the_others_with_their_command(real_run, tmp_path):
    """make workbook's reports (write_reports with the notebook's figures folder) draw nothing: the figures
    the notebook saved are embedded, every other one of run_figures' is named with the command that draws it,
    and the communication table stays."""
    import shutil

    from launch.report import write_reports

    runs, shown = tmp_path / "runs", tmp_path / "figures"
    shutil.copytree(real_run, runs / "M4", ignore=shutil.ignore_patterns(REPORT_FILE))
    (shown / "M4").mkdir(parents=True)
    (shown / "M4" / "timeline.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"shown by the notebook")
    written, problems = write_reports(runs, shown=shown)
    page = Page(written[0].read_text(encoding="utf-8"))
    assert problems == [] and list(page.figures()) == ["timeline"]
    others = set(run_figures(real_run)) - {"timeline"}
    text = written[0].read_text(encoding="utf-8")
    assert len(others) == 5 and text.count(f"python -m launch report {runs / 'M4'}") == len(others)
    assert "id='volume-table'" in text  # the communication table needs the traces, not the figure
