"""``python -m launch report``: one self-contained HTML page per run directory.

One real 2-rank M4 launch (session fixture) and synthetic run directories (a failed run, runs that
shared a launch). The page is parsed with the stdlib's ``html.parser`` and compared with the run's
own files and with ``run_figures``' output; a headless chromium (skipped when missing) opens it with
the network blocked and saves /tmp/report.png.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import launch
from hyper_parallel.run_files import METRICS_FILE, SUMMARY_FILE
from hyper_parallel.viz import run_figures
from launch.cli import main as cli_main
from launch.report import REPORT_FILE, find_run_dirs, write_report, write_reports

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = Path("/tmp/report.png")
INJECTED = '<script>alert("pwned")</script> & <img src=http://example.com/x.png>'
ERROR = (
    'rank 1 failed: exit code 1\nTraceback (most recent call last):\n  File "worker.py", line 3\nRuntimeError: boom <b>'
)


class Page(HTMLParser):
    """The parts of a report the tests look at: tags with attributes and ancestors, texts, number cells."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict]] = []
        self.tags: list[tuple[str, dict, tuple[str, ...]]] = []
        self.texts: list[tuple[str, tuple[str, ...], tuple[dict, ...]]] = []
        self.cells: dict[tuple[str, int | None], tuple[str, str]] = {}  # (data-key, step) -> (data-value, text)
        self.cell_list: list[tuple[str, str | None, str]] = []  # (data-key, data-value, text), repeats kept
        self.degree_cells: dict[str, str] = {}
        self._cell: tuple[dict, list[str]] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs, tuple(t for t, _ in self.stack)))
        if tag == "td" and ("data-key" in attrs or "data-degree" in attrs):
            self._cell = (attrs, [])
        if tag not in self.VOID:
            self.stack.append((tag, attrs))

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            attrs, text = self._cell
            if "data-degree" in attrs:
                self.degree_cells[attrs["data-degree"]] = "".join(text)
            else:
                step = int(attrs["data-step"]) if "data-step" in attrs else None
                self.cells[(attrs["data-key"], step)] = (attrs.get("data-value"), "".join(text))
                self.cell_list.append((attrs["data-key"], attrs.get("data-value"), "".join(text)))
            self._cell = None
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1].append(data)
        self.texts.append((data, tuple(t for t, _ in self.stack), tuple(a for _, a in self.stack)))

    def find(self, tag: str, **attrs: str) -> list[dict]:
        return [
            a for t, a, _ in self.tags if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def figures(self) -> dict[str, str]:
        """data-figure -> the src of the <img> inside that <figure>."""
        found, current = {}, None
        for tag, attrs, _ in self.tags:
            if tag == "figure":
                current = attrs.get("data-figure")
            elif tag == "img" and current is not None:
                found[current] = attrs.get("src", "")
                current = None
        return found

    def text_in(self, section: str) -> str:
        return "".join(text for text, _, attrs in self.texts if any(a.get("id") == section for a in attrs))


def write_log(log_root: Path, rank: int, stream: str, lines: list[str]) -> None:
    folder = log_root / "4f1c-launch" / "attempt_0" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stream}.log").write_text("".join(line + "\n" for line in lines))


def failed_run(folder: Path, with_logs: bool = True) -> Path:
    """What the launcher leaves after rank 1 raised: summary.json with the error, logs, no metrics, no traces."""
    folder.mkdir(parents=True)
    summary = {
        "recipe": "M4",
        "degrees": {"world_size": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1, "pp": 1, "ep": 1, "etp": 1},
        "ok": False,
        "losses": [],
        "reference_losses": [],
        "max_abs_diff": None,
        "max_param_diff": None,
        "step_times": [],
        "returncode": 1,
        "duration": 12.5,
        "error": ERROR,
    }
    (folder / SUMMARY_FILE).write_text(json.dumps(summary))
    if not with_logs:
        return folder
    logs = folder / "torchrun_logs_abc"
    write_log(logs, 0, "stdout", [f"rank 0 line {i}" for i in range(2050)])
    write_log(logs, 0, "stderr", [])
    write_log(logs, 1, "stdout", ["starting", INJECTED])
    write_log(logs, 1, "stderr", ERROR.splitlines()[1:])
    return folder


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


def assert_self_contained(page: Page) -> None:
    for tag, attrs, _ in page.tags:
        assert tag != "link", attrs
        for name in ("src", "href", "srcset", "action", "poster", "data"):
            value = attrs.get(name)
            if value is not None:
                assert value.startswith(("data:", "#")), (tag, name, value[:80])
    assert [a for a in page.find("script")] == [{}]  # our one inline script (it unfolds logs to print)


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


def test_report_of_a_failed_run_shows_the_error_and_escaped_logs(tmp_path):
    run_dir = failed_run(tmp_path / "failed")
    path = write_report(run_dir, tmp_path / "out")
    assert path == (tmp_path / "out" / REPORT_FILE).resolve()  # a folder as --out gets report.html inside
    text = path.read_text(encoding="utf-8")
    page = Page(text)
    assert_self_contained(page)
    assert '<script>alert("pwned")' not in text and "&lt;script&gt;alert(&quot;pwned&quot;)" in text
    injected = [tags for data, tags, _ in page.texts if INJECTED in data]
    assert len(injected) == 1 and "details" in injected[0] and "pre" in injected[0]  # literal text, folded
    assert page.find("span", id="verdict", data_ok="false")
    assert "RuntimeError: boom <b>" in page.text_in("error") and "boom &lt;b&gt;" in text
    assert "FAILED · rank 1" in page.text_in("verdict")
    assert [a["data-rank"] for a in page.find("details", **{"class": "log failed"})] == ["1"]
    assert "the first 50 lines are not shown" in page.text_in("logs")
    assert "rank 0 line 2049" in text and "rank 0 line 49\n" not in text
    assert set(page.figures()) == set(run_figures(run_dir)) == {"mesh"}  # no traces, no losses
    assert {a["data-missing-figure"] for a in page.find("p") if "data-missing-figure" in a} == {
        "numerics",
        "placements",
        "placement_overview",
        "timeline",
        "comm_volume",
    }
    assert "Timeline: not drawn, the workers wrote no trace files" in page.text_in("timeline")
    assert page.cells[("max_abs_diff", None)] == (None, "–")


def test_runs_sharing_a_launch_get_their_own_launch_logs(tmp_path):
    """run_many: logs sit next to batch.json in the parent; a notebook may start one launch per world size."""
    root = tmp_path / "notebook"
    root.mkdir()
    (root / "batch.json").write_text("[]")
    for index, (label, line) in enumerate((("M4", "first launch says hi"), ("M7", "second launch says hi"))):
        logs = root / f"torchrun_logs_{index}"
        write_log(logs, 0, "stdout", [line])
        run_dir = failed_run(root / label, with_logs=False)
        os.utime(logs, (1000 + 10 * index, 1000 + 10 * index))
        os.utime(run_dir / SUMMARY_FILE, (1005 + 10 * index, 1005 + 10 * index))
    written, problems = write_reports(root)
    assert problems == [] and written == [root / "M4" / REPORT_FILE, root / "M7" / REPORT_FILE]
    assert find_run_dirs(root) == [root / "M4", root / "M7"]
    first, second = (path.read_text() for path in written)
    assert "first launch says hi" in first and "second launch says hi" not in first
    assert "this launch ran several runs one after another" in first
    assert "second launch says hi" in second and "first launch says hi" not in second


def test_invalid_input_exits_2_with_an_actionable_message(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli_main(["report", str(tmp_path / "empty")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    failed_run(tmp_path / "runs" / "M4")
    assert cli_main(["report", str(tmp_path / "runs")]) == 2
    assert "it holds the run directories M4: pass one of them" in capsys.readouterr().err
    broken = failed_run(tmp_path / "broken")
    (broken / METRICS_FILE).write_text("{not json")
    assert cli_main(["report", str(broken)]) == 2
    assert "metrics.json is not valid JSON" in capsys.readouterr().err


def test_cli_writes_the_report_without_importing_torch(tmp_path):
    run_dir = failed_run(tmp_path / "failed")
    code = (
        "import sys; from launch.cli import main; status = main(['report', sys.argv[1], '--out', sys.argv[2]]); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(status)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(run_dir), str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "no torch" in done.stdout and f"report: {(tmp_path / 'r.html').resolve()}" in done.stdout
    assert (tmp_path / "r.html").stat().st_size > 1000


@pytest.mark.distributed
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_report_renders_offline_in_headless_chromium(real_report):
    sync_api = pytest.importorskip("playwright.sync_api")
    path, page_parsed = real_report
    url = path.as_uri()
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
            page.screenshot(path=str(SCREENSHOT), full_page=True)
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
    assert SCREENSHOT.stat().st_size > 50_000


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


def test_report_command_needs_one_run_or_two_to_compare(tmp_path, capsys):
    assert cli_main(["report"]) == 2
    assert "give a run directory" in capsys.readouterr().err
    run_dir = failed_run(tmp_path / "failed")
    assert cli_main(["report", str(run_dir), "--compare", str(run_dir), str(run_dir)]) == 2
    assert "not both" in capsys.readouterr().err
    assert cli_main(["report", "--compare", str(run_dir), str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_volume_rows_carry_the_cost_model_for_tp_collectives_too(tmp_path):
    """A synthetic M3 run (TP+SP on 2 ranks): rank 0's traced totals per (op, group), written by hand as the
    cost model's own bytes, get the model's prediction for every TP collective (estimate(recipe_model("M3"))
    computed here) and no fully_shard minimum (not an FSDP collective)."""
    from hyper_parallel import ParallelDims
    from hyper_parallel.cost_model import estimate, recipe_model
    from launch.report.build import _volume_rows
    from launch.report.run_data import read_run

    run_dir = failed_run(tmp_path / "m3", with_logs=False)
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    summary.update(recipe="M3", ok=True, degrees={"world_size": 2, "tp": 2})
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary))
    model = estimate(recipe_model("M3"), ParallelDims(world_size=2, tp=2))
    events = [
        {
            "kind": "collective",
            "op": c.op,
            "group": c.group,
            "phase": c.phase,
            "step": 1,
            "ranks": [0, 1],
            "bytes": c.bytes / c.count,
        }
        for c in model.collectives
        for _ in range(c.count)
    ]
    for rank in (0, 1):
        (run_dir / f"trace_rank{rank}.json").write_text(json.dumps({"rank": rank, "events": events}))
    rows = _volume_rows(read_run(run_dir))
    expected = model.by_op_group()
    assert {(r["op"], r["group"]): r["predicted"] for r in rows} == expected
    assert {(r["op"], r["group"]): r["measured"] for r in rows} == pytest.approx(expected)
    assert {r["group"] for r in rows} == {"tp"} and all(r["minimum"] is None for r in rows)
