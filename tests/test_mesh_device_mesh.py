"""The DeviceMeshes ``build_mesh`` makes (MeshViews): their dim names, shapes and the process group each
rank gets on every dim, read from real DeviceMeshes in one process on torch's "fake" process-group backend
(no worker is started), against the hand-derived rank groups of tests/mesh_expectations.py and the
index arithmetic stated next to each check.
"""

from __future__ import annotations

import contextlib

import pytest
from mesh_expectations import ALL_DIMS, LAYOUT_A, LAYOUTS, norm

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _rank_cases():
    for param in LAYOUTS:
        kwargs, expected = param.values
        world = kwargs["world_size"]
        for rank in (0, 5, world - 1):
            yield pytest.param(kwargs, expected, rank, id=f"{param.id}-rank{rank}")


@pytest.mark.parametrize("kwargs, expected, rank", list(_rank_cases()))
def test_device_mesh_groups(kwargs, expected, rank):
    dims = ParallelDims(**kwargs)
    with fake_process_group(dims.world_size, rank) as dist:
        views = build_mesh(dims, "cpu")
        for dim in ALL_DIMS:
            if dim not in expected:
                with pytest.raises(ValueError, match=r"unknown mesh dim"):
                    views.all_group_ranks(dim)
                continue
            if dims.ep == 1 and dim in (MeshDim.EP, MeshDim.EFSDP):
                # no sparse mesh is built without EP
                with pytest.raises(ValueError):
                    views.all_group_ranks(dim)
                with pytest.raises(ValueError):
                    views[dim]
                continue
            from_mesh = views.all_group_ranks(dim)
            assert norm(from_mesh) == norm(dims.group_ranks(dim)) == norm(expected[dim]), dim
            # and the process group this rank actually got on that dim is its hand-derived group
            mine = next(group for group in expected[dim] if rank in group)
            assert dist.get_process_group_ranks(views[dim].get_group()) == sorted(mine), dim

        # the dense view has every dim, even at size 1
        assert views.dense.mesh_dim_names == (MeshDim.DP_REPLICATE, MeshDim.DP_SHARD, MeshDim.CP, MeshDim.TP)
        assert tuple(views.dense.shape) == (dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp)

        # HSDP mesh (dp_replicate, fsdp): the ranks sharing this rank's tp coordinate
        hsdp = views[MeshDim.DP_REPLICATE, MeshDim.FSDP]
        assert hsdp.mesh_dim_names == (MeshDim.DP_REPLICATE, MeshDim.FSDP)
        assert tuple(hsdp.shape) == (dims.dp_replicate, dims.fsdp)
        assert sorted(hsdp.mesh.flatten().tolist()) == sorted(next(g for g in expected[MeshDim.DP_CP] if rank in g))
        # (fsdp, tp): the ranks sharing this rank's dp_replicate coordinate
        fsdp_tp = views[MeshDim.FSDP, MeshDim.TP]
        assert fsdp_tp.mesh_dim_names == (MeshDim.FSDP, MeshDim.TP)
        assert tuple(fsdp_tp.shape) == (dims.fsdp, dims.tp)
        block = dims.world_size // dims.dp_replicate
        start = rank // block * block
        assert sorted(fsdp_tp.mesh.flatten().tolist()) == list(range(start, start + block))

        if dims.ep > 1:
            ep_mesh = views[MeshDim.EP]
            assert ep_mesh.mesh_dim_names == (MeshDim.EP,)
            assert ep_mesh.size() == dims.ep
            assert sorted(ep_mesh.mesh.tolist()) == next(g for g in expected[MeshDim.EP] if rank in g)
            assert views.sparse.mesh_dim_names == (
                (MeshDim.DP_REPLICATE, MeshDim.EFSDP, MeshDim.EP, MeshDim.ETP)
                if dims.etp > 1
                else (MeshDim.DP_REPLICATE, MeshDim.EFSDP, MeshDim.EP)
            )
        else:
            with pytest.raises(ValueError, match=r"no sparse \(expert\) mesh: ep=1"):
                _ = views.sparse

        # unknown dims, and dims of one view in the wrong order
        with pytest.raises(ValueError, match=r"no view has the dims \('foo',\)"):
            views["foo"]
        with pytest.raises(ValueError, match=r"no view has the dims \('dp_replicate', 'foo'\)"):
            views[MeshDim.DP_REPLICATE, "foo"]
        with pytest.raises(ValueError, match=r"in this order"):
            views[MeshDim.TP, MeshDim.FSDP]
        with pytest.raises(ValueError, match=r"no view has the dims"):
            views[MeshDim.EP, MeshDim.TP]  # ep and tp live in different views
        with pytest.raises(ValueError, match=r"unknown mesh dim 'foo'"):
            views.all_group_ranks("foo")


def test_build_mesh_needs_matching_process_group():
    import torch.distributed as dist

    dims = ParallelDims(**LAYOUT_A)
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        build_mesh(dims, "cpu")
    with (
        fake_process_group(4, 0),
        pytest.raises(ValueError, match=r"the process group has 4 ranks but ParallelDims.world_size=8"),
    ):
        build_mesh(dims, "cpu")


@pytest.mark.parametrize("rank", [0, 6])
def test_device_mesh_with_pp(rank):
    """pp=2 x dp_shard=2 x tp=2: the real DeviceMeshes give the pp groups (r, r+4) and, inside rank's stage,
    the same (fsdp, tp) submeshes as a 4-rank run shifted by 4 * stage; a stage's fully_shard mesh
    views["dp_replicate", "fsdp"] stays inside its stage."""
    dims = ParallelDims(world_size=8, pp=2, dp_shard=2, tp=2)
    with fake_process_group(8, rank) as dist:
        views = build_mesh(dims, "cpu")
        assert views.dense.mesh_dim_names == (
            MeshDim.PP,
            MeshDim.DP_REPLICATE,
            MeshDim.DP_SHARD,
            MeshDim.CP,
            MeshDim.TP,
        )
        assert views.all_group_ranks(MeshDim.PP) == [[0, 4], [1, 5], [2, 6], [3, 7]]
        assert dist.get_process_group_ranks(views[MeshDim.PP].get_group()) == [rank % 4, rank % 4 + 4]
        stage = rank // 4
        fsdp = views[MeshDim.DP_REPLICATE, MeshDim.FSDP]
        assert fsdp.mesh_dim_names == (MeshDim.DP_REPLICATE, MeshDim.FSDP)
        assert sorted(fsdp.mesh.flatten().tolist()) == [4 * stage + rank % 2, 4 * stage + rank % 2 + 2]
