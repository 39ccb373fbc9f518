"""Communication behind compute: prefetch and reductions in flight change when collectives run, never
what they compute.

The session's recipe runs (tests/conftest.py) train every recipe with overlap on (the default) and M4,
M7, M6 and S2 once more with every fully_shard collective synchronous (``overlap=False``), in the same
launches. Checked here, from the runs' traces and metrics:

* the same losses bit for bit, the same parameters against the reference, and the same collectives
  (op, group, bytes, unit) on every rank, overlap on and off;
* order of issue with overlap (2-block MLP M4, step 1, backward): the next unit's all-gather (blocks.0)
  is issued before the current unit's (blocks.1) backward compute ends, and blocks.1's reduce-scatter
  is waited for only after blocks.0's backward compute has begun;
* at most one unit gathered ahead: no two prefetched all-gathers are in flight at once.
"""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import OVERLAP_OFF, result_of

from hyper_parallel.recipes import RECIPES
from hyper_parallel.viz.overlap import exposure

pytestmark = pytest.mark.distributed


def pair(name: str, recipe_results):
    default = RECIPES[name].default
    return (result_of(name, default, recipe_results), result_of(name, {**default, "overlap": False}, recipe_results))


def collectives(events: list[dict]) -> Counter:
    return Counter(
        (e["step"], e["op"], e["group"], e["bytes"], e["module"]) for e in events if e["kind"] == "collective"
    )


@pytest.mark.parametrize("name", OVERLAP_OFF)
def test_overlap_changes_no_number(recipe_results, name):
    on, off = pair(name, recipe_results)
    assert on.ok and off.ok, (on.error, off.error)
    assert (on.metrics["overlap"], off.metrics["overlap"]) == (True, False)
    assert on.metrics["losses"] == off.metrics["losses"]  # bit for bit
    assert on.metrics["max_param_diff"] == off.metrics["max_param_diff"]
    for rank in on.traces:
        assert collectives(on.traces[rank]) == collectives(off.traces[rank]), rank
        assert any(e.get("asynchronous") for e in on.traces[rank])
        assert not any(e.get("asynchronous") for e in off.traces[rank])


def spans(events: list[dict], kind: str, module: str, phase: str, step: int = 1) -> list[dict]:
    return [
        e for e in events if e["kind"] == kind and e["module"] == module and e["phase"] == phase and e["step"] == step
    ]


def test_order_of_issue_in_backward(recipe_results):
    on, _ = pair("M4", recipe_results)
    for rank, events in on.traces.items():
        block1_compute = spans(events, "compute", "blocks.1", "backward")
        block0_compute = spans(events, "compute", "blocks.0", "backward")
        prefetch = [e for e in spans(events, "collective", "blocks.0", "backward") if e["op"] == "all_gather"]
        scatter = [e for e in spans(events, "collective", "blocks.1", "backward") if e["op"] == "reduce_scatter"]
        assert block1_compute and block0_compute and len(prefetch) == 1 and len(scatter) == 1, rank
        assert prefetch[0]["asynchronous"] and prefetch[0]["t_start"] < max(e["t_end"] for e in block1_compute)
        assert scatter[0]["asynchronous"] and scatter[0]["t_wait"] >= min(e["t_start"] for e in block0_compute)


@pytest.mark.parametrize("name", OVERLAP_OFF)
def test_at_most_one_unit_gathered_ahead(recipe_results, name):
    on, _ = pair(name, recipe_results)
    for rank, events in on.traces.items():
        ahead = sorted(
            (e["t_start"], e["t_end"])
            for e in events
            if e["kind"] == "collective" and e["op"] == "all_gather" and e.get("asynchronous")
        )
        assert ahead, rank
        assert all(later[0] >= earlier[1] for earlier, later in zip(ahead, ahead[1:])), rank


@pytest.mark.parametrize("name", OVERLAP_OFF)
def test_overlap_hides_communication_that_the_synchronous_run_exposes(recipe_results, name):
    """With overlap, some of every rank's communication runs behind compute (a reduce-scatter in flight while
    the next unit's backward computes): hidden > 0, which fails if the hooks waited at once or the tracer
    missed the compute spans. Without it, hidden is 0 while communication is in flight."""
    on, off = pair(name, recipe_results)
    for rank, numbers in exposure(on.traces, step=1).items():
        assert numbers["hidden"] > 0 and numbers["exposed"] < numbers["in_flight"], (rank, numbers)
    for rank, numbers in exposure(off.traces, step=1).items():
        assert numbers["in_flight"] > 0 and numbers["hidden"] == pytest.approx(0.0, abs=1e-9), (rank, numbers)


def test_exposure_arithmetic_by_hand():
    """Collectives [0, 4] and [6, 8], compute [1, 3] and [7, 10]: in flight 6 s, of which 2 + 1 s run behind
    compute, so 3 s are exposed."""
    events = [
        {"kind": "collective", "step": 1, "phase": "backward", "t_start": 0.0, "t_end": 4.0},
        {"kind": "collective", "step": 1, "phase": "backward", "t_start": 6.0, "t_end": 8.0},
        {"kind": "compute", "step": 1, "t_start": 1.0, "t_end": 3.0},
        {"kind": "compute", "step": 1, "t_start": 7.0, "t_end": 10.0},
    ]
    assert exposure({0: events}, step=1)[0] == {"in_flight": 6.0, "exposed": 3.0, "hidden": 3.0, "compute": 5.0}
