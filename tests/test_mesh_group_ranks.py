"""The rank groups ParallelDims gives for every mesh dim (``group_ranks``, ``group_of``, ``coordinates``,
``views``), on 8- and 64-rank layouts with and without expert parallelism and with pp as the outermost
dim. The expected groups are the hand derivations of tests/mesh_expectations.py (literal lists, or index
arithmetic over the rank formula), never the library's own helpers.
"""

from __future__ import annotations

import pytest
from mesh_expectations import ALL_DIMS, LAYOUT_A, LAYOUTS, groups_64, norm

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim


def test_hand_derivation_64_sanity():
    g = groups_64(4, 4)
    assert g[MeshDim.TP][0] == [0, 1, 2, 3] and g[MeshDim.TP][-1] == [60, 61, 62, 63]
    assert [0, 4] in g[MeshDim.CP] and [33, 37] in g[MeshDim.CP]
    assert [1, 9, 17, 25] in g[MeshDim.DP_SHARD]
    assert [5, 37] in g[MeshDim.DP_REPLICATE]
    assert [0, 4, 8, 12] in g[MeshDim.EP] and [16, 20, 24, 28] in g[MeshDim.EP]  # s_lo in {0,1}, c in {0,1}
    assert [0, 16] in g[MeshDim.EFSDP]
    assert groups_64(16, 1)[MeshDim.EP][0] == list(range(16))
    assert groups_64(8, 1)[MeshDim.EP][1] == list(range(8, 16))


@pytest.mark.parametrize("kwargs, expected", LAYOUTS)
def test_group_ranks_match_hand_derivation(kwargs, expected):
    dims = ParallelDims(**kwargs)
    for dim in ALL_DIMS:
        if dim not in expected:
            # etp == 1: the sparse view has no etp dim (docs/design.md §2: (dp_replicate, efsdp, ep[, etp]));
            # ep == 1: there is no sparse view at all
            assert dims.etp == 1 and (dim == MeshDim.ETP or dims.ep == 1)
            with pytest.raises(ValueError, match=rf"there is no '{dim}' dim"):
                dims.group_ranks(dim)
            continue
        got = dims.group_ranks(dim)
        assert all(group == sorted(group) for group in got), dim
        assert norm(got) == norm(expected[dim]), dim
        # groups partition the world, each of the size of the dim
        flat = sorted(r for group in got for r in group)
        assert flat == list(range(dims.world_size)), dim
        size = {MeshDim.FSDP: dims.fsdp, MeshDim.DP: dims.dp, MeshDim.DP_CP: dims.dp_cp, MeshDim.EFSDP: dims.efsdp}.get(
            dim
        )
        size = getattr(dims, dim) if size is None else size
        assert {len(group) for group in got} == {size}, dim
        for rank in (0, dims.world_size - 1):
            assert rank in dims.group_of(dim, rank)


def test_group_of_and_unknown_dim():
    dims = ParallelDims(**LAYOUT_A)
    assert dims.group_of(MeshDim.CP, 5) == [5, 7]
    assert dims.group_of(MeshDim.FSDP, 3) == [1, 3, 5, 7]
    with pytest.raises(ValueError, match=r"rank 8 is outside world_size=8"):
        dims.group_of(MeshDim.TP, 8)
    with pytest.raises(ValueError, match=r"rank -1 is outside world_size=8"):
        dims.group_of(MeshDim.TP, -1)
    with pytest.raises(ValueError, match=r"unknown mesh dim 'pp'"):  # pp=1: no pp dim
        dims.group_ranks(MeshDim.PP)
    with pytest.raises(ValueError, match=r"unknown mesh dim 'foo'"):
        dims.group_ranks("foo")


def test_pp_is_the_outermost_dim_of_every_view():
    """pp=2, dp_shard=2, tp=2 on 8 ranks, by hand: stage s holds the contiguous ranks 4s..4s+3, so the pp
    groups pair rank r with r+4; inside a stage the mesh is the pp=1 mesh of 4 ranks shifted by 4s."""
    dims = ParallelDims(world_size=8, pp=2, dp_shard=2, tp=2)
    assert all(view[0] == (MeshDim.PP, 2) for view in dims.views().values())
    assert dims.group_ranks(MeshDim.PP) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.group_ranks(MeshDim.TP) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.group_ranks(MeshDim.FSDP) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.coordinates(6)[MeshDim.PP] == 1 and dims.coordinates(6)[MeshDim.DP] == 1
    sparse = ParallelDims(world_size=8, pp=2, dp_shard=4, ep=2).views()["sparse"]
    assert sparse == ((MeshDim.PP, 2), (MeshDim.DP_REPLICATE, 1), (MeshDim.EFSDP, 2), (MeshDim.EP, 2))
    assert MeshDim.PP not in dict(ParallelDims(world_size=8).views()["dense"])  # pp=1 views unchanged
