"""fully_shard's reading of a mesh (docs/design.md §3) and its errors for bad use, in one process.

torch's "fake" process-group backend lets us build real DeviceMeshes for 8 ranks without workers;
nothing here communicates (fully_shard's init issues no collective).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.distributed.fake_pg import FakeStore

from hyper_parallel import ParallelDims, fully_shard
from hyper_parallel.fsdp.roles import resolve_roles, without_size_one_dims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh


@pytest.fixture(scope="module")
def views():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        yield build_mesh(ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, tp=2), "cpu")
    finally:
        dist.destroy_process_group()


# mesh dims -> (replicate dims, shard dim) for enable_param_shard = None / True / False, derived from the rules:
# tp/ep/etp model-parallel; dp_replicate replicates; of two other dims the outer replicates, one other shards;
# None shards iff the shard dim has size > 1; False turns the shard dim into a replica dim.
@pytest.mark.parametrize(
    "dims, enable, replicate, shard",
    [
        (("fsdp",), None, (), "fsdp"),
        (("dp_replicate", "fsdp"), None, ("dp_replicate",), "fsdp"),
        (("dp_replicate", "fsdp"), False, ("dp_replicate", "fsdp"), None),
        (("dp_replicate", "fsdp"), True, ("dp_replicate",), "fsdp"),
        (("dp_replicate", "fsdp", "tp"), None, ("dp_replicate",), "fsdp"),
        (("tp",), None, (), None),
        (("dp_replicate", "tp"), None, ("dp_replicate",), None),
        (("dp",), None, (), "dp"),
        (("dp", "cp"), None, ("dp", "cp"), None),  # cp has size 1 here: nothing to shard over
        (("dp", "cp"), True, ("dp",), "cp"),
    ],
)
def test_roles(views, dims, enable, replicate, shard):
    roles = resolve_roles(views[dims], enable)
    assert roles.replicate_dims == replicate and roles.shard_dim == shard
    assert roles.model_parallel_dims == tuple(d for d in dims if d == "tp")


def test_group_sizes_follow_rfc_examples(views):
    hsdp = build_mesh(ParallelDims(world_size=8, dp_replicate=2, dp_shard=4), "cpu")
    roles = resolve_roles(hsdp["dp_replicate", "fsdp"], None)  # rank_size 8, shard 4, dp 2
    assert (roles.rank_size, roles.shard_size, roles.dp_size) == (8, 4, 2)
    pure = build_mesh(ParallelDims(world_size=8, dp_shard=8), "cpu")
    roles = resolve_roles(pure["dp_replicate", "fsdp"], False)  # rank_size 8, shard 1, dp 8
    assert (roles.rank_size, roles.shard_size, roles.dp_size) == (8, 1, 8)


def test_enable_true_without_shard_dim(views):
    with pytest.raises(ValueError, match="enable_param_shard=True but the mesh .* has no dim to shard"):
        resolve_roles(views[MeshDim.TP], True)


def test_ambiguous_meshes_are_rejected(views):
    with pytest.raises(ValueError, match="ambiguous fully_shard mesh"):
        resolve_roles(views[MeshDim.DP_REPLICATE, MeshDim.DP_SHARD, MeshDim.CP], None)
    with pytest.raises(ValueError, match="must be True, False or None"):
        resolve_roles(views[MeshDim.FSDP], "yes")


def test_bad_use_errors(views):
    with pytest.raises(ValueError, match="already been applied .* once per module"):
        module = fully_shard(nn.Linear(4, 4), mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
        fully_shard(module, mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    integer = nn.Linear(4, 4)
    integer.weight = nn.Parameter(torch.zeros(4, 4, dtype=torch.int64), requires_grad=False)
    with pytest.raises(ValueError, match="floating-point parameters only.*ignored_params"):
        fully_shard(integer, mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    # tp groups {0, 4}, {1, 5}, ... where the views group {0, 1}, {2, 3}, ...: inconsistent ranks.
    other_root = init_device_mesh("cpu", (2, 4), mesh_dim_names=(MeshDim.TP, MeshDim.DP))
    layer = nn.Linear(4, 4)
    layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), other_root["tp"], [Shard(0)]))
    with pytest.raises(ValueError, match=r"cannot be combined into one mesh \(Cannot concatenate overlapping"):
        fully_shard(layer, mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    clash = nn.Linear(4, 4)
    clash.weight = nn.Parameter(distribute_tensor(clash.weight.detach(), views[MeshDim.FSDP], [Replicate()]))
    with pytest.raises(ValueError, match="uses as a data-parallel dim"):
        fully_shard(clash, mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    with pytest.raises(ValueError, match="expects an nn.Module"):
        fully_shard(torch.zeros(3), mesh=views[MeshDim.FSDP])


def test_layout_of_a_colwise_weight(views):
    """A colwise TP weight [out, in] is Shard(0) on tp: FSDP shards the other axis (1)."""
    layer = nn.Linear(6, 4)
    layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), views[MeshDim.TP], [Shard(0)]))
    layer.bias = nn.Parameter(distribute_tensor(layer.bias.detach(), views[MeshDim.TP], [Shard(0)]))
    fully_shard(layer, mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    weight, bias = layer.weight, layer.bias
    assert weight.device_mesh.mesh_dim_names == ("dp_replicate", "fsdp", "tp")
    assert weight.placements == (Replicate(), Shard(1), Shard(0))
    assert weight.to_local().shape == (2, 3)  # [4/tp, 6/fsdp]
    strided = bias.placements[1]  # 1-D: same axis, strided after tp
    assert isinstance(strided, _StridedShard) and strided.dim == 0 and strided.split_factor == 2
    assert bias.to_local().shape == (1,)  # 4/tp = 2, then 2/fsdp = 1
    assert weight.sharded_group_info.name == "fsdp" and weight.sharded_group_info.ranks == (0, 2)
    assert weight.unsharded_group_info.name == "dp_replicate" and weight.unsharded_group_info.ranks == (0, 4)
    assert (weight.rank_size, weight.shard_size, weight.dp_size) == (4, 2, 2)


@pytest.fixture(scope="module")
def ones(views):  # on the process group that ``views`` starts
    """The views of 8 ranks as S2's degrees lay them out twice over: (dp_replicate=1, fsdp=4, tp=2) and the
    experts' (dp_replicate=1, efsdp=1, ep=4, etp=2); on the same fake process group as ``views``."""
    return build_mesh(ParallelDims(world_size=8, dp_shard=4, tp=2, ep=4, etp=2), "cpu")


def test_dtensors_live_on_the_dims_above_one(views, ones):
    """A size-1 dim is dropped from the mesh a parameter's DTensor is built on (a (1, n) HSDP mesh is FSDP on n);
    when every dim is 1, the innermost data-parallel dim stays. GroupInfo and the traces keep the named mesh."""
    dense = ones[MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP]
    assert without_size_one_dims(dense, ("dp_replicate", "fsdp")).mesh_dim_names == ("fsdp", "tp")
    experts = ones[MeshDim.DP_REPLICATE, MeshDim.EFSDP, MeshDim.EP, MeshDim.ETP]
    assert without_size_one_dims(experts, ("dp_replicate", "efsdp")).mesh_dim_names == ("ep", "etp")
    alone = ones[MeshDim.DP_REPLICATE, MeshDim.DP_SHARD, MeshDim.CP]  # (1, 4, 1)
    assert without_size_one_dims(alone, ("dp_replicate", "dp_shard", "cp")).mesh_dim_names == ("dp_shard",)
    full = views[MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP]  # (2, 2, 2): nothing to drop
    assert without_size_one_dims(full, ("dp_replicate", "fsdp")) is full

    hsdp, fsdp = nn.Linear(8, 8), nn.Linear(8, 8)
    fully_shard(hsdp, mesh=ones[MeshDim.DP_REPLICATE, MeshDim.FSDP])  # (1, 4)
    fully_shard(fsdp, mesh=ones[MeshDim.FSDP])
    for layer in (hsdp, fsdp):
        assert layer.weight.device_mesh.mesh_dim_names == ("fsdp",) and layer.weight.placements == (Shard(0),)
    assert hsdp.weight.sharded_group_info.name == "fsdp" and hsdp.weight.unsharded_group_info.name == "dp_replicate"
    assert (hsdp.weight.rank_size, hsdp.weight.shard_size, hsdp.weight.dp_size) == (4, 4, 1)
    state = hsdp._hp_state.groups[0].params[0]
    assert state.mesh_dims() == ("dp_replicate", "fsdp")  # what the traces and figures show
    assert state.sharded_placements == (Replicate(), Shard(0))

    single = nn.Linear(8, 8)  # every data dim of size 1 and no model-parallel dim: one data dim stays
    fully_shard(single, mesh=ones[MeshDim.DP_REPLICATE, MeshDim.EFSDP])
    assert single.weight.device_mesh.mesh_dim_names == ("efsdp",) and single.weight.placements == (Replicate(),)
