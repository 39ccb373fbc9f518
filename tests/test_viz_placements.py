"""The placement figures of hyper_parallel.viz (``placement_transitions``, ``placement_overview``,
``rank_ranges``, ``representative_param``) on synthetic placement events, read back from their artists:
which rank's colour is drawn in which block of a parameter, the rows and columns each rank holds, and what
the titles say for sharded, unsharded and MoE runs. Expected owners and ranges are derived by hand from the
placements and the rank layout stated next to each check (no workers started).
"""

from __future__ import annotations

from matplotlib.colors import to_rgba
from matplotlib.patches import Rectangle
from viz_traces import axes_labelled, placement_event

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.viz import (
    mesh_map,
    placement_overview,
    placement_transitions,
    rank_color,
    rank_ranges,
)
from hyper_parallel.viz.placements import representative_param

FSDP_TP = ParallelDims(world_size=4, dp_shard=2, tp=2)  # fsdp view (dp_replicate, fsdp, tp): rank = 2*fsdp + tp


def _fsdp_tp_events():
    return [
        placement_event("w", "(S(1), S(0))", "(R, S(0))", (4, 4), "forward", 0, 0.1),
        placement_event("norm", "(S(0), R)", "(R, R)", (4,), "forward", 0, 0.1),
        placement_event("w", "(R, S(0))", "(S(1), S(0))", (4, 4), "forward", 0, 0.2),
        placement_event("norm", "(R, R)", "(S(0), R)", (4,), "forward", 0, 0.2),
    ]


def _owners_by_block(ax, half=2):
    """{(row-half, col-half) of a block's corner: sorted ranks whose colour is drawn inside the block}."""
    colours = {rank_color(r, 4): r for r in range(4)}
    blocks = [p for p in ax.patches if p.get_gid() == "block"]
    owners = {}
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and (patch.get_gid() or "").startswith("owner"):
            x, y = patch.get_x() + patch.get_width() / 2, patch.get_y() + patch.get_height() / 2
            rank = colours[to_rgba(patch.get_facecolor())]
            assert patch.get_gid() == f"owner{rank}"
            (block,) = [
                b
                for b in blocks
                if b.get_x() <= x <= b.get_x() + b.get_width() and b.get_y() <= y <= b.get_y() + b.get_height()
            ]
            owners.setdefault((int(block.get_y() // half), int(block.get_x() // half)), []).append(rank)
    assert len(owners) == len(blocks)
    return {block: sorted(ranks) for block, ranks in owners.items()}


def test_placement_grid_colours_are_the_owner_ranks_fsdp_tp():
    fig = placement_transitions(_fsdp_tp_events(), FSDP_TP, param="w", recipe="B-1")
    # (fsdp, tp) placements (S(1), S(0)) of a [4, 4] weight: rows split by tp, columns by fsdp;
    # block (row-half i, col-half j) belongs to the rank with fsdp=j, tp=i, i.e. rank 2*j + i.
    sharded = {(0, 0): [0], (0, 1): [2], (1, 0): [1], (1, 1): [3]}
    assert _owners_by_block(axes_labelled(fig, "state:sharded")) == sharded
    assert _owners_by_block(axes_labelled(fig, "state:resharded")) == sharded
    # unsharded (R, S(0)): each row-half is held whole by the two ranks of that tp index
    unsharded = _owners_by_block(axes_labelled(fig, "state:unsharded"))
    assert unsharded == {(0, 0): [0, 2], (1, 0): [1, 3]}
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "tp: S(0) kept" in texts and "fsdp: S(1) → R" in texts and "fsdp: R → S(1)" in texts
    assert "(fsdp, tp) = (S(1), S(0))" in axes_labelled(fig, "state:sharded").get_title()
    assert "B-1" in fig._suptitle.get_text()


def test_rank_ranges_strided_and_uneven():
    # _S(0, 2) on fsdp then S(0) on tp: split over tp first, each tp half over fsdp
    ranges = rank_ranges((8, 4), (MeshDim.FSDP, MeshDim.TP), "(_S(0, 2), S(0))", FSDP_TP)
    assert {r: ranges[r][0] for r in range(4)} == {0: (0, 2), 2: (2, 4), 1: (4, 6), 3: (6, 8)}
    assert all(ranges[r][1] == (0, 4) for r in range(4))
    # torch.chunk semantics: 5 rows over 4 ranks -> 2, 2, 1, 0
    dims = ParallelDims(world_size=4, dp_shard=4)
    assert [rank_ranges((5,), (MeshDim.FSDP,), "(S(0))", dims)[r][0] for r in range(4)] == [
        (0, 2),
        (2, 4),
        (4, 5),
        (5, 5),
    ]
    # flattened dim name and the sparse view: experts S(0) over ep, hidden S(2) over etp
    moe = ParallelDims(world_size=4, dp_shard=2, tp=2, ep=2, etp=2)
    flattened = f"{MeshDim.DP_REPLICATE}+{MeshDim.EFSDP}"
    experts = rank_ranges((4, 8, 6), (flattened, MeshDim.EP, MeshDim.ETP), "(R, S(0), S(2))", moe)
    assert experts[3] == [(2, 4), (0, 8), (3, 6)] and experts[0] == [(0, 2), (0, 8), (0, 3)]


def test_representative_param_and_overview():
    events = _fsdp_tp_events()
    assert representative_param(events) == "w"
    fig = placement_overview(events, FSDP_TP, recipe="B-1")
    cells = axes_labelled(fig, "overview").tables[0].get_celld()
    rows = {
        cells[(r, 1)].get_text().get_text(): [cells[(r, c)].get_text().get_text() for c in range(8)] for r in (1, 2)
    }
    assert rows["w"][2:] == ["[4, 4]", "fsdp, tp", "(S(1), S(0))", "(R, S(0))", "[2, 2]", "[2, 4]"]
    assert rows["norm"][4:] == ["(S(0), R)", "(R, R)", "[2]", "[4]"]
    assert "changed between sharded and unsharded: fsdp" in fig._suptitle.get_text()
    assert "kept: tp" in fig._suptitle.get_text()


# ----- runs that shard nothing (DDP, pure TP) and MoE runs: what the figures say (issue 19) -----
def test_unsharded_run_says_nothing_is_gathered_and_never_fsdp():
    """M1 (DDP) on dp_shard=2: the parameter is (R, R) before and after, so no panel says "sharded",
    the subtitle says nothing is gathered, and the mesh calls dp_shard a replica dim, not fsdp."""
    dims = ParallelDims(world_size=2, dp_shard=2)
    events = [placement_event("w", "(R, R)", "(R, R)", (4, 4), "forward", 0, 0.1, (MeshDim.DP_REPLICATE, MeshDim.FSDP))]
    fig = placement_transitions(events, dims, recipe="M1")
    titles = [ax.get_title() for ax in fig.axes if ax.get_label().startswith("state:")]
    assert [ax.get_label() for ax in fig.axes if ax.get_label().startswith("state:")] == [
        "state:stored",
        "state:in compute",
    ]
    assert not any("sharded" in t for t in titles), titles
    suptitle = fig._suptitle.get_text()
    assert "nothing is gathered" in suptitle and "only the FSDP dim is gathered" not in suptitle
    unsharded = mesh_map(dims, "M1", sharded=False)
    [ax] = unsharded.axes
    assert "fsdp" not in ax.get_title() and "not sharded" in ax.get_title()
    assert "dp_shard = fsdp = 2" in mesh_map(dims, "M4").axes[0].get_title()  # FSDP keeps its name


def test_sharded_run_keeps_the_fsdp_subtitle():
    fig = placement_transitions(_fsdp_tp_events(), FSDP_TP, param="w", recipe="B-1")
    assert "only the FSDP dim is gathered" in fig._suptitle.get_text()
    assert [ax.get_label() for ax in fig.axes if ax.get_label().startswith("state:")] == [
        "state:sharded",
        "state:unsharded",
        "state:resharded",
    ]


def test_parameters_sharded_reads_the_units():
    from hyper_parallel.viz import parameters_sharded

    assert parameters_sharded({"units": [{"shard_size": 1}, {"shard_size": 2}]})
    assert not parameters_sharded({"units": [{"shard_size": 1}, {"shard_size": 1}]})
    assert parameters_sharded({})  # no units listed: the mesh decides


def test_representative_param_of_a_moe_run_is_an_expert_weight():
    """S1: a 2-D TP-free dense weight gathered on fsdp and a 3-D expert weight [4, 8, 4], S(0) on ep,
    gathered on efsdp: the figure shows the expert weight (3-D tensors are candidates too), with
    the ep shard kept: rank 0 (ep 0) holds experts 0-1, half of their rows while sharded on efsdp."""
    dims = ParallelDims(world_size=4, dp_shard=4, ep=2)
    sparse = (MeshDim.DP_REPLICATE, MeshDim.EFSDP, MeshDim.EP)
    dense = (MeshDim.DP_REPLICATE, MeshDim.FSDP)
    events = [
        placement_event("tok_embeddings.weight", "(R, S(0))", "(R, R)", (8, 4), "forward", 0, 0.1, dense),
        placement_event("layers.1.experts.w1", "(R, S(1), S(0))", "(R, R, S(0))", (4, 8, 4), "forward", 0, 0.2, sparse),
        placement_event("layers.1.experts.w1", "(R, R, S(0))", "(R, S(1), S(0))", (4, 8, 4), "forward", 0, 0.3, sparse),
    ]
    assert representative_param(events) == "layers.1.experts.w1"
    # S2-like: the expert weight wins over a TP-sharded 2-D weight next to it
    tp_weight = placement_event(
        "layers.0.attention.wq.weight",
        "(R, S(1), S(0))",
        "(R, R, S(0))",
        (8, 8),
        "forward",
        0,
        0.05,
        (MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP),
    )
    assert representative_param([tp_weight] + events) == "layers.1.experts.w1"
    fig = placement_transitions(events, dims, recipe="S1")
    sharded = axes_labelled(fig, "state:sharded")
    assert "rank 0 holds [2, 4, 4] of [4, 8, 4]" in sharded.get_title()
    assert "rank 0 holds [2, 8, 4]" in axes_labelled(fig, "state:unsharded").get_title()
