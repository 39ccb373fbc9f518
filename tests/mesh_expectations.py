"""Hand-derived expectations shared by the mesh tests (tests/test_mesh_*.py): the mesh layouts and the rank
groups of every dim on them, written out literally or derived by the stated index arithmetic, never by
calling the library's own helpers.
"""

from __future__ import annotations

import pytest

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim

ALL_DIMS = (
    MeshDim.DP_REPLICATE,
    MeshDim.DP_SHARD,
    MeshDim.CP,
    MeshDim.TP,
    MeshDim.FSDP,
    MeshDim.DP,
    MeshDim.DP_CP,
    MeshDim.EFSDP,
    MeshDim.EP,
    MeshDim.ETP,
)
DEGREES = ("dp_replicate", "dp_shard", "cp", "ulysses", "tp", "pp", "ep", "etp")  # the degrees, by name


def norm(groups):
    """Order-independent form of a list of rank groups."""
    return sorted(sorted(g) for g in groups)


def is_valid(**kwargs) -> bool:
    try:
        ParallelDims(**kwargs)
    except ValueError:
        return False
    return True


# Layout A: (dp_replicate, dp_shard, cp, tp) = (1, 2, 2, 2), ep = 2, etp = 2 ->
#   rank = (s*2 + c)*2 + t; efsdp = 2*2*2 // (2*2) = 2; sparse view (1, efsdp=2, ep=2, etp=2)
LAYOUT_A = dict(world_size=8, dp_shard=2, cp=2, tp=2, ep=2, etp=2)
GROUPS_A = {
    MeshDim.DP_REPLICATE: [[0], [1], [2], [3], [4], [5], [6], [7]],
    MeshDim.DP_SHARD: [[0, 4], [1, 5], [2, 6], [3, 7]],
    MeshDim.CP: [[0, 2], [1, 3], [4, 6], [5, 7]],
    MeshDim.TP: [[0, 1], [2, 3], [4, 5], [6, 7]],
    MeshDim.FSDP: [[0, 2, 4, 6], [1, 3, 5, 7]],
    MeshDim.DP: [[0, 4], [1, 5], [2, 6], [3, 7]],
    MeshDim.DP_CP: [[0, 2, 4, 6], [1, 3, 5, 7]],
    MeshDim.EFSDP: [[0, 4], [1, 5], [2, 6], [3, 7]],
    MeshDim.EP: [[0, 2], [1, 3], [4, 6], [5, 7]],
    MeshDim.ETP: [[0, 1], [2, 3], [4, 5], [6, 7]],
}

# Layout B: dp_replicate = 2, tp = 2, dp_shard = 2 (inferred), ep = etp = 1 ->
#   rank = (r*2 + s)*2 + t; efsdp = 2*1*2 // 1 = 4; sparse view (2, efsdp=4, ep=1), no etp dim
LAYOUT_B = dict(world_size=8, dp_replicate=2, tp=2)
GROUPS_B = {
    MeshDim.DP_REPLICATE: [[0, 4], [1, 5], [2, 6], [3, 7]],
    MeshDim.DP_SHARD: [[0, 2], [1, 3], [4, 6], [5, 7]],
    MeshDim.CP: [[0], [1], [2], [3], [4], [5], [6], [7]],
    MeshDim.TP: [[0, 1], [2, 3], [4, 5], [6, 7]],
    MeshDim.FSDP: [[0, 2], [1, 3], [4, 6], [5, 7]],
    MeshDim.DP: [[0, 2, 4, 6], [1, 3, 5, 7]],
    MeshDim.DP_CP: [[0, 2, 4, 6], [1, 3, 5, 7]],
}
# ep = 1: no sparse view, so no efsdp / ep / etp groups

# Layout B2: same dense dims, ep = 4, etp = 1 (EP borrows all of tp and all of dp_shard):
#   efsdp = 2*1*2 // 4 = 1; sparse view (2, efsdp=1, ep=4)
LAYOUT_B2 = dict(world_size=8, dp_replicate=2, tp=2, ep=4)
GROUPS_B2 = {
    **GROUPS_B,
    MeshDim.EFSDP: [[0], [1], [2], [3], [4], [5], [6], [7]],
    MeshDim.EP: [[0, 1, 2, 3], [4, 5, 6, 7]],
}

# Layout B3: same dense dims, ep = 2, etp = tp = 2 (EP borrows dp_shard): efsdp = 2*1*2 // 4 = 1;
#   sparse view (2, efsdp=1, ep=2, etp=2)
LAYOUT_B3 = dict(world_size=8, dp_replicate=2, tp=2, ep=2, etp=2)
GROUPS_B3 = {
    **GROUPS_B,
    MeshDim.EFSDP: [[0], [1], [2], [3], [4], [5], [6], [7]],
    MeshDim.EP: [[0, 2], [1, 3], [4, 6], [5, 7]],
    MeshDim.ETP: [[0, 1], [2, 3], [4, 5], [6, 7]],
}


def groups_64(ep: int, etp: int) -> dict[str, list[list[int]]]:
    """Hand derivation for (dp_replicate, dp_shard, cp, tp) = (2, 4, 2, 4) on 64 ranks.

    rank = ((r*DS + s)*CP + c)*TP + t with DS=4, CP=2, TP=4, so: tp groups are 4 consecutive ranks,
    the cp partner of a rank is rank+4 (or rank-4), dp_shard peers are 8 apart, the dp_replicate partner
    is rank+32 (or rank-32). A group of a dim holds every rank whose other coordinates are fixed.
    For the sparse (expert) dims dp_shard is split as s = s_hi*2 + s_lo (s_lo the inner half):
      etp == tp == 4, ep == 4 : EP borrows all of cp and the inner part of dp_shard: ep varies (s_lo, c),
                                etp varies t (= the tp groups), efsdp varies s_hi (2 = 4*2*4 // (4*4));
      etp == 1, ep == 16      : EP borrows cp*tp and the inner part of dp_shard: ep varies (s_lo, c, t)
                                (16 consecutive ranks), efsdp varies s_hi (2 = 32 // 16);
      etp == 1, ep == 8       : EP borrows exactly cp*tp: ep varies (c, t) (8 consecutive ranks),
                                efsdp varies all of s (4 = 32 // 8), i.e. the dp_shard groups.
    """
    R, DS, CP, TP = 2, 4, 2, 4

    def rank(r, s, c, t):
        return ((r * DS + s) * CP + c) * TP + t

    g = {
        MeshDim.DP_REPLICATE: [
            [rank(r, s, c, t) for r in range(R)] for s in range(DS) for c in range(CP) for t in range(TP)
        ],
        MeshDim.DP_SHARD: [
            [rank(r, s, c, t) for s in range(DS)] for r in range(R) for c in range(CP) for t in range(TP)
        ],
        MeshDim.CP: [[rank(r, s, c, t) for c in range(CP)] for r in range(R) for s in range(DS) for t in range(TP)],
        MeshDim.TP: [[rank(r, s, c, t) for t in range(TP)] for r in range(R) for s in range(DS) for c in range(CP)],
        # fsdp = dp_shard*cp: fixed (r, t), vary (s, c)
        MeshDim.FSDP: [[rank(r, s, c, t) for s in range(DS) for c in range(CP)] for r in range(R) for t in range(TP)],
        # dp = dp_replicate*dp_shard: fixed (c, t), vary (r, s)
        MeshDim.DP: [[rank(r, s, c, t) for r in range(R) for s in range(DS)] for c in range(CP) for t in range(TP)],
        # dp_cp: fixed t, vary (r, s, c)
        MeshDim.DP_CP: [[rank(r, s, c, t) for r in range(R) for s in range(DS) for c in range(CP)] for t in range(TP)],
    }
    if (ep, etp) == (4, 4):
        g[MeshDim.EP] = [
            [rank(r, 2 * s_hi + s_lo, c, t) for s_lo in range(2) for c in range(CP)]
            for r in range(R)
            for s_hi in range(2)
            for t in range(TP)
        ]
        g[MeshDim.EFSDP] = [
            [rank(r, 2 * s_hi + s_lo, c, t) for s_hi in range(2)]
            for r in range(R)
            for s_lo in range(2)
            for c in range(CP)
            for t in range(TP)
        ]
        g[MeshDim.ETP] = g[MeshDim.TP]
    elif (ep, etp) == (16, 1):
        g[MeshDim.EP] = [
            [rank(r, 2 * s_hi + s_lo, c, t) for s_lo in range(2) for c in range(CP) for t in range(TP)]
            for r in range(R)
            for s_hi in range(2)
        ]
        g[MeshDim.EFSDP] = [
            [rank(r, 2 * s_hi + s_lo, c, t) for s_hi in range(2)]
            for r in range(R)
            for s_lo in range(2)
            for c in range(CP)
            for t in range(TP)
        ]
    elif (ep, etp) == (8, 1):
        g[MeshDim.EP] = [[rank(r, s, c, t) for c in range(CP) for t in range(TP)] for r in range(R) for s in range(DS)]
        g[MeshDim.EFSDP] = g[MeshDim.DP_SHARD]
    else:
        raise AssertionError("no hand derivation for this ep/etp")
    return g


LAYOUTS_64 = [(4, 4), (16, 1), (8, 1)]


def layout_64(ep, etp):
    return dict(world_size=64, dp_replicate=2, dp_shard=4, cp=2, tp=4, ep=ep, etp=etp)


LAYOUTS = [
    pytest.param(LAYOUT_A, GROUPS_A, id="8-A-(1,2,2,2)-ep2-etp2"),
    pytest.param(LAYOUT_B, GROUPS_B, id="8-B-hsdp-tp-ep1"),
    pytest.param(LAYOUT_B2, GROUPS_B2, id="8-B2-ep4-etp1"),
    pytest.param(LAYOUT_B3, GROUPS_B3, id="8-B3-ep2-etp2"),
] + [pytest.param(layout_64(ep, etp), groups_64(ep, etp), id=f"64-ep{ep}-etp{etp}") for ep, etp in LAYOUTS_64]
"""(ParallelDims kwargs, {dim: hand-derived rank groups}) of every layout the group tests read."""
