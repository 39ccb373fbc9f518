"""Reports of run directories written by hand into ``tmp_path`` (no launch): a failed run shows its error
and its logs escaped, folded and trimmed, and only the figures its files allow; runs that shared one launch
each get their own launch's logs; and a synthetic TP run's communication rows carry the cost model's bytes
(``estimate`` of the recipe's model, computed here) for every TP collective. Expected text is what the
synthetic files contain.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from report_page import INJECTED, Page, assert_self_contained, failed_run, write_log

from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.run_files import SUMMARY_FILE
from hyper_parallel.viz import FIGURES, run_figures
from launch.report import REPORT_FILE, find_run_dirs, write_report, write_reports


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


def test_volume_rows_carry_the_cost_model_for_tp_collectives_too(tmp_path):
    """A synthetic M3 run (TP+SP on 2 ranks): rank 0's traced totals per (op, group), written by hand as the
    cost model's own bytes, get the model's prediction for every TP collective (estimate(recipe_model("M3"))
    computed here) and no fully_shard minimum (not an FSDP collective)."""
    from hyper_parallel import ParallelDims
    from hyper_parallel.cost_model import estimate, recipe_model
    from launch.report.predicted import volume_rows
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
    rows = volume_rows(read_run(run_dir))
    expected = model.by_op_group()
    assert {(r["op"], r["group"]): r["predicted"] for r in rows} == expected
    assert {(r["op"], r["group"]): r["measured"] for r in rows} == pytest.approx(expected)
    assert {r["group"] for r in rows} == {MeshDim.TP} and all(r["minimum"] is None for r in rows)


def test_reports_embed_the_figures_a_notebook_saved_and_name_the_rest(tmp_path):
    """make workbook's layout: runs/<run>/ next to figures/<run>/<name>.png; the report of each run embeds
    the saved PNG byte for byte, draws no other figure and names each one it lacks (with the command that
    draws them, tests/test_report_real_run.py); without the notebook's folder every figure is drawn."""
    import base64

    runs, shown = tmp_path / "runs", tmp_path / "figures"
    run_dir = failed_run(runs / "M4")
    (shown / "M4").mkdir(parents=True)
    saved = b"\x89PNG\r\n\x1a\n" + b"saved by the notebook"
    (shown / "M4" / "mesh.png").write_bytes(saved)
    written, problems = write_reports(runs, shown=shown)
    assert problems == [] and written == [(run_dir / REPORT_FILE).resolve()]
    text = written[0].read_text(encoding="utf-8")
    assert base64.b64encode(saved).decode("ascii") in text
    assert text.count("<img") == 1, "a figure the notebook did not show was drawn"
    assert set(re.findall(r"data-missing-figure='(\w+)'", text)) == set(FIGURES) - {"mesh"}
    write_reports(runs)  # without the notebook's files: drawn as before
    drawn = written[0].read_text(encoding="utf-8")
    assert base64.b64encode(saved).decode("ascii") not in drawn and "draws every figure" not in drawn


def test_a_pipeline_runs_report_puts_its_measured_bubble_beside_the_formula(tmp_path):
    """Two stages, two microbatches (1F1B), actions written by hand: rank 0 busy 0-1, 1-2, 4-5, 5-6 and rank 1
    busy 1-2, 2-3, 3-4, 4-5 of a 0-6 s step, so idle 2/6 on each rank: 33 % measured; the formula
    (p-1)/(m+p-1) = 1/3 of the schedule."""
    from hyper_parallel.run_files import METRICS_FILE, TRACE_FILE
    from launch.report.page import pipeline_bubble
    from launch.report.run_data import read_run

    busy = {0: [(0, 1), (1, 2), (4, 5), (5, 6)], 1: [(1, 2), (2, 3), (3, 4), (4, 5)]}
    for rank, spans in busy.items():
        events = [{"kind": "pipeline", "step": 0, "t_start": a, "t_end": b} for a, b in spans]
        (tmp_path / TRACE_FILE.format(rank=rank)).write_text(json.dumps({"rank": rank, "events": events}))
    notes = {"schedule": "1f1b", "microbatches": 2, "stages_per_rank": 1}
    metrics = {"recipe": "P1", "degrees": {"world_size": 2, "pp": 2}, "notes": notes, "ok": True}
    (tmp_path / METRICS_FILE).write_text(json.dumps(metrics))
    text = pipeline_bubble(read_run(tmp_path))
    assert text.startswith("1f1b: 33% measured") and "(p-1)/(m+p-1)" in text and "33%" in text.split("formula")[1]
    del metrics["notes"]
    (tmp_path / METRICS_FILE).write_text(json.dumps(metrics))
    assert pipeline_bubble(read_run(tmp_path)) is None  # not a pipeline run
