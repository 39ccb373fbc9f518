"""``hyper_parallel.viz.timeline`` and ``clock_offsets`` on a synthetic 4-rank HSDP trace
(tests/viz_traces.py): one bar per collective of the chosen step, rows per (rank, group) in the order the
collectives ran, and a rank's clock offset recovered from the ends of the collectives it shared. Expected
counts, rows and offsets are counted by hand from the synthetic trace (no workers started).
"""

from __future__ import annotations

import pytest
from viz_traces import axes_labelled, hsdp_traces

from hyper_parallel.viz import clock_offsets, timeline


def _bars(fig, gid="collective"):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def test_timeline_draws_one_bar_per_collective_of_the_step():
    dims, traces = hsdp_traces()
    for step in (None, 0):  # default: the last step; init-phase collectives are not part of a step
        fig = timeline(traces, step=step, recipe="M7", degrees=dims)
        chosen = 1 if step is None else 0
        expected = sum(
            1
            for events in traces.values()
            for e in events
            if e["kind"] == "collective" and e["step"] == chosen and e["phase"] != "init"
        )
        assert len(_bars(fig)) == expected == 28
        assert f"step {chosen}" in fig._suptitle.get_text()
    fig = timeline(traces, by_group=True)
    labels = [t.get_text() for t in axes_labelled(fig, "timeline").get_yticklabels()]
    assert labels[:2] == ["rank 0 · fsdp", "rank 0 · dp_replicate"]
    # HSDP: on rank 0 each unit's reduce-scatter on fsdp is followed by its all-reduce on dp_replicate
    rank0 = sorted((p.get_x(), p.get_y()) for p in _bars(fig) if p.get_y() < 1.5)
    rows = [round(y + 0.38) for _, y in rank0]
    assert rows == [0, 0, 0, 0, 1, 0, 1]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"all_gather", "reduce_scatter", "all_reduce", "group fsdp", "group dp_replicate"} <= set(legend)


def test_clock_offsets_are_recovered_from_collective_ends():
    _, traces = hsdp_traces(offset=0.05)
    offsets = clock_offsets(traces)
    assert offsets[0] == pytest.approx(0.0, abs=1e-6) and offsets[1] == pytest.approx(0.05, abs=1e-6)
    assert offsets[2] == pytest.approx(0.0, abs=1e-6) and offsets[3] == pytest.approx(0.0, abs=1e-6)
    fig = timeline(traces, by_group=False)
    starts = {round(p.get_y() + 0.38): p.get_x() for p in _bars(fig)}
    assert starts[0] == pytest.approx(starts[1])
