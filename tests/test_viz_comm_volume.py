"""Communication volume: ``theoretical_bytes`` of fully_shard units (FSDP, HSDP, DDP through fully_shard)
against the byte counts worked out by hand in the comments, ``wire_factor`` against the ring formulas, and
the ``comm_volume`` figure of a synthetic 4-rank HSDP trace (tests/viz_traces.py) whose measured and
theoretical bars and per-rank wire bytes are summed by hand (no workers started).
"""

from __future__ import annotations

import pytest
from viz_traces import HSDP_UNITS, axes_labelled, collective_event, hsdp_traces

from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.viz import comm_volume, theoretical_bytes, wire_factor


def test_theoretical_bytes_fsdp_and_hsdp():
    fsdp = [dict(u, dp_size=1) for u in HSDP_UNITS]
    # unit a: AG 2000 in forward + 2000 in backward (resharded after forward), RS 2000;
    # root: AG 400 once (kept unsharded until backward), RS 400
    assert theoretical_bytes(fsdp) == {("all_gather", MeshDim.FSDP): 4400, ("reduce_scatter", MeshDim.FSDP): 2400}
    # HSDP adds one all-reduce of mp-local bytes / shard_size per unit: 2000/2 + 400/2
    assert theoretical_bytes(HSDP_UNITS) == {
        ("all_gather", MeshDim.FSDP): 4400,
        ("reduce_scatter", MeshDim.FSDP): 2400,
        ("all_reduce", MeshDim.DP_REPLICATE): 1200,
    }
    # DDP through fully_shard (shard_size 1): all-reduce of everything on the unsharded group only
    ddp = [
        dict(HSDP_UNITS[0], shard_size=1, dp_size=4, unsharded_group={"name": MeshDim.DP_SHARD, "ranks": [0, 1, 2, 3]})
    ]
    assert theoretical_bytes(ddp) == {("all_reduce", MeshDim.DP_SHARD): 2000}
    # 8-way fsdp, 3000 bytes, no reshard after forward; 2 replicas: AR 3000/8
    big = [dict(HSDP_UNITS[0], model_local_bytes=3000, shard_size=8, reshard_after_forward=False)]
    assert theoretical_bytes(big)[("all_reduce", MeshDim.DP_REPLICATE)] == 375
    assert wire_factor("all_gather", 4) == 0.75 and wire_factor("all_reduce", 4) == 1.5
    assert wire_factor("reduce_scatter", 1) == 0


def test_comm_volume_bars_and_ratios():
    dims, traces = hsdp_traces()
    traces[0].append(
        collective_event("all_gather", MeshDim.FSDP, [0, 1], 440, "forward", "root", 1, 1.9, 1.91)
    )  # padding/extra
    metrics = {"recipe": "M7", "degrees": dims.degrees(), "units": HSDP_UNITS}
    fig = comm_volume(traces, metrics)
    ax = axes_labelled(fig, "volume")
    measured = sorted(p.get_height() for p in ax.patches if p.get_gid() == "measured")
    theory = sorted(p.get_height() for p in ax.patches if p.get_gid() == "theory")
    assert measured == [1200, 2400, 4840] and theory == [1200, 2400, 4400]
    notes = [t.get_text().split("\n")[0] for t in ax.texts]
    assert notes == ["×1.10 of min", "×1.00 of min", "×1.00 of min"]
    wire = axes_labelled(fig, "wire")
    per_rank = {}
    for p in wire.patches:
        per_rank[round(p.get_x() + p.get_width() / 2)] = (
            per_rank.get(round(p.get_x() + p.get_width() / 2), 0) + p.get_height()
        )
    # rank 1: (4400 AG + 2400 RS) * 1/2 + 1200 AR * 2 * 1/2
    assert per_rank[1] == pytest.approx(3400 + 1200)


def test_the_measured_only_note_is_clear_of_the_legend_and_tp_runs_claim_no_minimum():
    """04's M5: the "measured only" note sat under the legend; 03's M2 (pure TP, no fully_shard
    collective) was titled against fully_shard's minimum."""
    dims, traces = hsdp_traces()
    traces[0].append(collective_event("all_gather", MeshDim.CP, [0, 1], 512, "forward", "layers.0", 1, 1.9, 1.91))
    fig = comm_volume(traces, {"recipe": "M7", "degrees": dims.degrees(), "units": HSDP_UNITS})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = axes_labelled(fig, "volume")
    [note] = [t for t in ax.texts if t.get_text().startswith("not fully_shard's")]
    legend = ax.get_legend().get_window_extent(renderer)
    assert not note.get_window_extent(renderer).overlaps(legend)
    assert all(not t.get_window_extent(renderer).overlaps(legend) for t in ax.texts)
    # 08's S1 and 12: the note ran on past the plot into the gap, the right panel's title past the figure
    plot, page = ax.get_window_extent(renderer), fig.bbox
    assert plot.x0 <= note.get_window_extent(renderer).x0 and note.get_window_extent(renderer).x1 <= plot.x1
    for title in (axes_labelled(fig, "wire").title, ax.title):
        box = title.get_window_extent(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1, title.get_text()
    tp_only = {r: [e for e in events if e.get("group") == MeshDim.CP] for r, events in traces.items()}
    tp_only = {r: events for r, events in tp_only.items() if events}
    fig = comm_volume(tp_only, {"recipe": "M2", "degrees": dims.degrees(), "units": []})
    assert "minimum" not in fig._suptitle.get_text() and "measured only" in fig._suptitle.get_text()
    assert "minimum" not in axes_labelled(fig, "volume").get_title()
