"""The emulated link on real runs (one launch of 2 ranks: the runs of notebook 01's lesson, one without the
link, and the ring (M5-R: sends and receives) and TP + SP (M3: DTensor's collectives, traced from torch) with
and without it): the numbers are bit for bit those without it, every collective lasts at least α + n·β, and
the α-β model predicts the step time and the exposed communication, overlap off and on, within 20 %. And
notebook 05's HSDP runs (M7, 4 ranks, a second launch): the step times within 20 % both ways, the exposed
communication with overlap within 20 %, and without overlap no less than the model's (4 ranks on 2 cores:
a rank also waits for a peer that is waiting for a core, which the model leaves out; every collective lasts
at least α + n·β, so the model's sum is a floor)."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from hyper_parallel.link import Link, parse_link
from launch.notebook.link_lesson import GLOBAL_BATCH, LINK, link_overlap_rows, link_runs
from launch.notebook.runs import run_recipes

pytestmark = pytest.mark.distributed

M4 = {"world_size": 2, "dp_shard": 2}
M7 = {"world_size": 4, "dp_replicate": 2, "dp_shard": 2}
OTHERS = {"M5-R": {"cp": 2}, "M3": {"tp": 2}}  # the ring's sends and receives; TP's collectives from DTensor
STEPS = 5  # the first records the units' order (no prefetch yet); the fastest of the other four is compared
HSDP_STEPS = 3  # notebook 05's: the faster of two steps after the first


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    given = {
        **link_runs(M4),
        "M4 without a link": {"recipe": "M4", **M4, "global_batch": GLOBAL_BATCH, "overlap": True},
        **{
            f"{name}{suffix}": {"recipe": name, "world_size": 2, **dims, "link": link}
            for name, dims in OTHERS.items()
            for suffix, link in (("", None), ("-link", LINK))
        },
    }
    results = run_recipes(given, steps=STEPS, out=tmp_path_factory.mktemp("link"), verbose=False)
    assert all(result.ok for result in results.values()), {k: r.error for k, r in results.items()}
    return results


def collectives(events: list[dict]) -> Counter:
    return Counter(
        (e["step"], e["op"], e["group"], e["bytes"], e["module"]) for e in events if e["kind"] == "collective"
    )


@pytest.mark.parametrize(
    ("linked", "free"), [("M4-link", "M4 without a link"), ("M5-R-link", "M5-R"), ("M3-link", "M3")]
)
def test_the_link_changes_no_number(runs, linked, free):
    linked, free = runs[linked], runs[free]
    assert linked.metrics["losses"] == free.metrics["losses"]  # bit for bit
    assert linked.metrics["max_param_diff"] == free.metrics["max_param_diff"]
    for rank in free.traces:
        assert collectives(linked.traces[rank]) == collectives(free.traces[rank])


def test_every_collective_lasts_at_least_the_link_time(runs):
    link = parse_link(LINK)
    for label in ("M4-link-sync", "M4-link", "M5-R-link", "M3-link"):
        assert Link.from_json(runs[label].metrics["link"]) == link
        for rank, events in runs[label].traces.items():
            for e in (e for e in events if e["kind"] == "collective"):
                needed = link.seconds(e["op"], len(e["ranks"]), e["bytes"])
                assert e["t_end"] - e["t_start"] >= needed - 1e-4, (label, rank, e)
    free = [e for e in runs["M4 without a link"].traces[0] if e["kind"] == "collective"]
    assert any(e["t_end"] - e["t_start"] < link.seconds(e["op"], 2, e["bytes"]) for e in free)


OVERLOADED = 4.0
"""Load average per core above which the timing comparison is skipped: with other processes queued on
every core a rank waits for a core after each emulated wait, and its peers wait for it. Measured here: at
loads of 7 to 11 on 2 cores every ratio model / measured was within 0.83 to 1.13; at 50 to 90 the
synchronous run waited 101 ms for a link of 70 and overlap's gain drowned."""


def test_the_model_predicts_step_and_exposed_communication_within_20_percent(runs):
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > OVERLOADED * cores:
        pytest.skip(f"load average {load:.1f} on {cores} cores: the ranks queue for a core, timings mean nothing")
    rows = {row["run"]: row for row in link_overlap_rows({k: runs[k] for k in ("M4-link-sync", "M4-link")})}
    assert set(rows) >= {"M4-link-sync", "M4-link"} and "M4 without a link" not in rows
    for label, row in rows.items():
        assert row["model_step"] == pytest.approx(row["step"], rel=0.2), (label, row)
        assert row["model_exposed"] == pytest.approx(row["exposed"], rel=0.2), (label, row)
    sync, overlap = rows["M4-link-sync"], rows["M4-link"]
    assert overlap["step"] < sync["step"] and overlap["model_step"] < sync["model_step"]
    assert overlap["exposed"] < sync["exposed"]


@pytest.fixture(scope="module")
def hsdp_runs(tmp_path_factory):
    results = run_recipes(
        link_runs(M7, recipe="M7"), steps=HSDP_STEPS, out=tmp_path_factory.mktemp("hsdp-link"), verbose=False
    )
    assert all(result.ok for result in results.values()), {k: r.error for k, r in results.items()}
    return results


def test_hsdp_on_the_link_as_the_model_has_it(hsdp_runs):
    sync, overlap = hsdp_runs["M7-link-sync"], hsdp_runs["M7-link"]
    assert sync.metrics["losses"] == overlap.metrics["losses"]  # bit for bit
    rows = {row["run"]: row for row in link_overlap_rows(hsdp_runs)}
    link = parse_link(LINK)
    collectives_of_step = [
        e for e in sync.traces[0] if e["kind"] == "collective" and e["step"] == rows["M7-link-sync"]["index"]
    ]
    assert {e["group"] for e in collectives_of_step} == {"fsdp", "dp_replicate"}
    floor = sum(link.seconds(e["op"], len(e["ranks"]), e["bytes"]) for e in collectives_of_step)
    assert rows["M7-link-sync"]["model_exposed"] == pytest.approx(floor)  # the cost model's bytes: the traced ones
    assert rows["M7-link-sync"]["exposed"] >= floor - 1e-4 * len(collectives_of_step)
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > OVERLOADED * cores:
        pytest.skip(f"load average {load:.1f} on {cores} cores: the ranks queue for a core, timings mean nothing")
    for label, row in rows.items():
        assert row["model_step"] == pytest.approx(row["step"], rel=0.2), (label, row)
    assert rows["M7-link"]["model_exposed"] == pytest.approx(rows["M7-link"]["exposed"], rel=0.2), rows["M7-link"]
    assert rows["M7-link"]["step"] < rows["M7-link-sync"]["step"]
    assert rows["M7-link"]["model_step"] < rows["M7-link-sync"]["model_step"]


def test_the_figure_stacks_each_step_measured_and_modelled(runs):
    from launch.notebook.link_lesson import link_overlap_figure

    lesson = {k: runs[k] for k in ("M4-link-sync", "M4-link", "M4 without a link")}
    rows = link_overlap_rows(lesson)
    fig = link_overlap_figure(lesson)
    ax = fig.axes[0]
    widths = [patch.get_width() for patch in ax.patches]
    assert len(widths) == 3 * 2 * len(rows)  # compute, the rest, waiting; measured and model; per run
    totals = [sum(widths[i : i + 3]) for i in range(0, len(widths), 3)]
    expected = [1e3 * t for row in rows for t in (row["step"], row["model_step"])]
    assert totals == pytest.approx(expected)
    assert "emulated link: α 2 ms, 1 MB/s" in fig._suptitle.get_text()


def test_notebook_05_runs_what_this_module_holds():
    """05's overlap section states what ``test_hsdp_on_the_link_as_the_model_has_it`` checks: the same link,
    batch and steps in its parameters cell."""
    import ast

    import nbformat

    from launch.notebook.workbook import NOTEBOOKS_DIR

    nb = nbformat.read(NOTEBOOKS_DIR / "05_hsdp.ipynb", as_version=4)
    parameters = next(cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", []))
    values = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(parameters.source).body
        if isinstance(node, ast.Assign)
    }
    assert (values["m7"], values["link"], values["link_batch"], values["link_steps"]) == (
        M7,
        LINK,
        GLOBAL_BATCH,
        HSDP_STEPS,
    )
