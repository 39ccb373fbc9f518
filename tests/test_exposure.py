"""Exposed communication and the timeline's compute strip, on hand-made traces (no workers).

The numbers below are derived by hand from the intervals written in each test.
"""

from __future__ import annotations

import pytest

from hyper_parallel.viz.overlap import chunk_overlap, exposure, length, minus, step_exposure, union
from hyper_parallel.viz.timeline import timeline


def collective(op, start, end, step=1, phase="backward", **extra):
    return {
        "kind": "collective",
        "op": op,
        "group": "fsdp",
        "ranks": [0, 1],
        "bytes": 64,
        "dtype": "float32",
        "phase": phase,
        "module": "blocks.0",
        "step": step,
        "t_start": start,
        "t_end": end,
        **extra,
    }


def compute(start, end, step=1, phase="backward", module="blocks.1"):
    return {"kind": "compute", "module": module, "phase": phase, "step": step, "t_start": start, "t_end": end}


def test_interval_arithmetic():
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert length([(0, 1), (0.5, 2), (3, 4)]) == 3
    assert minus([(0, 10)], [(1, 2), (4, 6), (9, 12)]) == [(0, 1), (2, 4), (6, 9)]
    assert minus([(0, 1)], []) == [(0, 1)]


def test_exposed_is_in_flight_without_compute():
    """An async all-gather in flight 1.0-4.0 s while compute runs 0.5-3.0 s: 2.0 s hidden, 1.0 s exposed;
    a synchronous reduce-scatter 5.0-5.5 s with no compute: all 0.5 s exposed. Step 2's events are ignored."""
    events = [
        compute(0.5, 3.0),
        collective("all_gather", 1.0, 4.0, asynchronous=True, t_wait=3.5),
        collective("reduce_scatter", 5.0, 5.5),
        collective("all_gather", 7.0, 9.0, step=2),
    ]
    numbers = step_exposure(events, step=1)
    assert numbers["in_flight"] == pytest.approx(3.5)
    assert numbers["exposed"] == pytest.approx(1.5)
    assert numbers["hidden"] == pytest.approx(2.0)
    assert numbers["compute"] == pytest.approx(2.5)
    assert exposure({0: events, 1: []}, step=1)[1]["in_flight"] == 0


def test_timeline_draws_compute_and_in_flight_parts():
    """One compute span per rank and one async collective per rank: two compute strips, two pale in-flight
    parts (issue to wait) and two solid collective bars (wait to end)."""
    traces = {
        rank: [compute(0.0, 2.0), collective("all_gather", 0.5, 3.0, asynchronous=True, t_wait=2.5)] for rank in (0, 1)
    }
    fig = timeline(traces, step=1, align=False)
    ax = fig.axes[0]
    gids = [patch.get_gid() for patch in ax.patches]
    assert gids.count("compute") == 2 and gids.count("in_flight") == 2 and gids.count("collective") == 2
    assert "r0 1000.0/2500.0 ms" in fig._suptitle.get_text()  # exposed 2.0-3.0 s, in flight 0.5-3.0 s


def test_chunk_overlap_counts_only_chunked_collectives():
    """Chunks 0 and 1 in flight 0-4 s and 1-3 s, compute 2-6 s: of their 4 s in flight, 2 s ran behind compute
    (fraction 0.5); the unchunked all-gather at 5-7 s is not async TP's and is left out."""
    events = [
        collective("all_gather", 0.0, 4.0, asynchronous=True, t_wait=3.5, chunk=0),
        collective("all_gather", 1.0, 3.0, asynchronous=True, t_wait=2.5, chunk=1),
        collective("all_gather", 5.0, 7.0),
        compute(2.0, 6.0),
    ]
    overlap = chunk_overlap(events, step=1)
    assert overlap == {"in_flight": 4.0, "hidden": 2.0, "fraction": 0.5, "collectives": 2}
    assert chunk_overlap(events[2:], step=1) is None
