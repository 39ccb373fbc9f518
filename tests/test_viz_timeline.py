"""``hyper_parallel.viz.timeline`` and ``clock_offsets`` on a synthetic 4-rank HSDP trace
(tests/viz_traces.py): one bar per collective of the chosen step, rows per (rank, group) in the order the
collectives ran, a rank's clock offset recovered from the ends of the collectives it shared, rank 0 and
one peer drawn by default, and a figure that reads: a one-line title, the legend below the axes (not over
the bars), the long notes in ``fig.notes``. Expected counts, rows and offsets are counted by hand from
the synthetic trace (no workers started).
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
        fig = timeline(traces, step=step, recipe="M7", degrees=dims, ranks="all")
        chosen = 1 if step is None else 0
        expected = sum(
            1
            for events in traces.values()
            for e in events
            if e["kind"] == "collective" and e["step"] == chosen and e["phase"] != "init"
        )
        assert len(_bars(fig)) == expected == 28
        assert f"step {chosen}" in fig._suptitle.get_text()
    fig = timeline(traces, by_group=True, ranks="all")
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
    fig = timeline(traces, by_group=False, ranks="all")
    starts = {round(p.get_y() + 0.38): p.get_x() for p in _bars(fig)}
    assert starts[0] == pytest.approx(starts[1])


def test_timeline_draws_rank_0_and_one_peer_by_default():
    """Rank 0 and rank 1 (its fsdp peer): 7 collectives each in step 1 of the synthetic trace."""
    dims, traces = hsdp_traces()
    fig = timeline(traces, recipe="M7", degrees=dims, by_group=False)
    labels = [t.get_text() for t in axes_labelled(fig, "timeline").get_yticklabels()]
    assert labels == ["rank 0", "rank 1"]
    assert len(_bars(fig)) == 2 * 7
    assert "ranks 0, 1 of 4" in fig._suptitle.get_text()
    assert any('ranks="all"' in note for note in fig.notes)
    fig = timeline(traces, ranks=[2], by_group=False)
    assert [t.get_text() for t in axes_labelled(fig, "timeline").get_yticklabels()] == ["rank 2"]
    with pytest.raises(ValueError, match="not all in the traces"):
        timeline(traces, ranks=[7])


def test_timeline_title_is_one_line_and_notes_carry_the_rest():
    """The notes once clipped in a 4-line title are in ``fig.notes``: rank 0's counts (3 AG, 2 RS, 2 AR
    per step, by hand from the synthetic trace: AG a, AG root, AG a, RS a, AR a, RS root, AR root)."""
    from hyper_parallel.viz.timeline import timeline_notes

    dims, traces = hsdp_traces()
    fig = timeline(traces, recipe="M7", degrees=dims)
    assert "\n" not in fig._suptitle.get_text()
    assert "AG" not in fig._suptitle.get_text()  # the counts answer exercises: not in the title
    assert fig.notes[0] == "rank 0 in step 1: 3 AG, 2 RS, 2 AR."
    assert timeline_notes(fig).splitlines()[1].startswith("* Clocks aligned")


def test_timeline_legend_sits_below_the_axes_and_the_title_fits(tmp_path):
    """Drawn (not only built): the legend's box lies under the axes' box, and the title's box inside the
    figure, so nothing is clipped or drawn over the bars."""
    dims, traces = hsdp_traces()
    fig = timeline(traces, recipe="M7", degrees=dims)
    fig.savefig(tmp_path / "timeline.png")
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    axes = axes_labelled(fig, "timeline").get_window_extent(renderer)
    assert legend.y1 <= axes.y0
    heading = fig._suptitle.get_window_extent(renderer)
    assert heading.x0 >= 0 and heading.x1 <= fig.bbox.width and heading.y1 <= fig.bbox.height


def test_unit_labels_keep_apart_and_inside_on_a_shared_scale():
    """07's and 91's timelines piled unit labels up ("root root", "layers.1layers.2") and cut the last one:
    on its own scale and on a scale twice the step's (91 draws two implementations on one), the labels on
    one line do not touch and every label ends inside the axes."""
    from hyper_parallel.viz.timeline import step_span

    _, traces = hsdp_traces()
    for span in (None, 2 * step_span(traces)):
        fig = timeline(traces, step=1, time_span=span)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = axes_labelled(fig, "timeline")
        plot = ax.get_window_extent(renderer)
        labels = [t for t in ax.texts if t.get_va() == "bottom" and t.get_rotation() == 0 and t.get_text()]
        assert labels
        lines: dict[float, list] = {}
        for label in labels:
            box = label.get_window_extent(renderer)
            assert plot.x0 <= box.x0 and box.x1 <= plot.x1 + 1, label.get_text()
            lines.setdefault(round(label.get_position()[1], 3), []).append(box)
        for boxes in lines.values():
            boxes.sort(key=lambda b: b.x0)
            assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))
