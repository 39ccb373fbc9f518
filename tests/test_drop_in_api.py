"""FSDP2's API surface on our fully_shard, in one process (torch's fake process group, 8 ranks).

What FSDP2 offers and we support behaves as FSDP2 documents it; what we do not support raises an
error naming it (never a silent ignore). The numbers of these features are checked against FSDP2 in
tests/test_drop_in.py; here: classes, errors, roles, meshes.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, DataParallelMeshDims, FSDPModule, OffloadPolicy
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.testing._internal.two_tensor import TwoTensor

from hyper_parallel import ParallelDims, fully_shard
from hyper_parallel.fsdp import FullyShardModule, UnshardHandle
from hyper_parallel.fsdp.module import UNSUPPORTED_FSDP2_METHODS
from hyper_parallel.fsdp.param_group import ShardedState
from hyper_parallel.fsdp.roles import resolve_roles
from hyper_parallel.fsdp.step import TRANSITIONS, TrainingState
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh


@pytest.fixture(scope="module")
def world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        yield init_device_mesh("cpu", (8,), mesh_dim_names=(MeshDim.FSDP,))
    finally:
        dist.destroy_process_group()


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.block = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight


def test_wrapper_class_is_cached_and_first_in_mro(world):
    a, b = fully_shard(nn.Linear(8, 8), mesh=world), fully_shard(nn.Linear(8, 8), mesh=world)
    assert type(a) is type(b)
    assert type(a).__mro__[1:4] == (FullyShardModule, FSDPModule, nn.Linear)


def test_torch_sees_an_fsdp_module(world):
    """torch's pipelining schedules and torchtitan's helpers test isinstance(m, FSDPModule): ours passes, and
    every method FSDPModule defines is ours (implemented or refused by name), so none of torch's reaches
    into FSDP2 state that our module does not have."""
    module = fully_shard(nn.Linear(8, 8), mesh=world)
    assert isinstance(module, FSDPModule)
    torch_methods = {name for name, value in vars(FSDPModule).items() if callable(value) and name != "__new__"}
    assert torch_methods, "FSDPModule defines no methods: this check reads the wrong class"
    missing = sorted(name for name in torch_methods if name not in vars(FullyShardModule))
    assert not missing, f"inherited from torch FSDP2, not defined by ours: {missing}"


def test_indexing_a_sharded_container_gives_the_plain_class(world):
    """FSDPModule.__new__ builds the user's class when a container slices itself (nn.Sequential[1:])."""
    model = fully_shard(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), mesh=world)
    assert type(model[1:]) is nn.Sequential


def test_deepcopy_is_refused_clearly(world):
    """As torch FSDP2 refuses it (an AssertionError, "FSDP does not support deepcopy"), with the fix."""
    for error in (RuntimeError, AssertionError):
        with pytest.raises(
            error, match="FSDP does not support deepcopy.*deepcopy of a fully_shard module .* state dict"
        ):
            copy.deepcopy(fully_shard(nn.Linear(8, 8), mesh=world))


def test_fully_shard_state_is_one_view_per_unit(world):
    """torch's fully_shard.state(module) / module._get_fsdp_state(): one state per fully_shard call, the same
    for every module of a unit of several, as FSDP2's; the wrapper class is named FSDP<Class>, as FSDP2's."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8))
    fully_shard([model[0], model[1]], mesh=world)
    fully_shard(model[2], mesh=world)
    fully_shard(model, mesh=world)
    states = [fully_shard.state(m) for m in (model, model[0], model[1], model[2])]
    assert states[1] is states[2] is model[0]._get_fsdp_state()
    assert len({id(s) for s in states}) == 3
    assert [type(m).__name__ for m in (model, model[0])] == ["FSDPSequential", "FSDPLinear"]


@pytest.mark.parametrize("method", sorted(UNSUPPORTED_FSDP2_METHODS))
def test_unsupported_fsdp2_methods_name_themselves(world, method):
    module = fully_shard(nn.Linear(8, 8), mesh=world)
    with pytest.raises(NotImplementedError, match=f"{method} .* not supported"):
        getattr(module, method)(None)


def test_unsupported_arguments_are_refused(world):
    with pytest.raises(ValueError, match=r"reshard_after_forward=3: an int must divide .* size 8.*\[1, 2, 4, 8\]"):
        fully_shard(nn.Linear(8, 8), mesh=world, reshard_after_forward=3)
    with pytest.raises(NotImplementedError, match="CPUOffloadPolicy"):
        fully_shard(nn.Linear(8, 8), mesh=world, offload_policy=CPUOffloadPolicy())
    fully_shard(nn.Linear(8, 8), mesh=world, offload_policy=OffloadPolicy())  # FSDP2's default: accepted


@pytest.mark.parametrize(
    "k, resolved, group", [(1, False, None), (8, True, None), (2, True, [0, 1]), (4, True, [0, 1, 2, 3])]
)
def test_reshard_after_forward_int(world, k, resolved, group):
    """As FSDP2: 1 is False, the shard size is True, otherwise the group of k consecutive shard ranks."""
    state = fully_shard(nn.Linear(8, 8), mesh=world, reshard_after_forward=k)._hp_state
    assert state.settings.reshard_after_forward is resolved
    post = state.groups[0].post_forward_group
    assert (list(post.ranks) if post else None) == group


def test_supported_setters(world):
    module = fully_shard(nn.Linear(8, 8), mesh=world)
    handle = module.unshard(async_op=True)
    assert isinstance(handle, UnshardHandle)
    handle.wait()
    module.reshard()
    module.set_reshard_after_backward(False)
    module.set_is_last_backward(True)
    module.set_reduce_scatter_divide_factor(4.0)
    assert module._hp_state.settings.reshard_after_backward is False
    assert module._hp_state.groups[0].reducer.gradient_divide_factor == 4.0


def test_tied_weight_is_one_sharded_parameter(world):
    model = Tied()
    fully_shard(model.block, mesh=world)
    fully_shard(model, mesh=world)
    assert model.head.weight is model.embed.weight
    assert [name for name, _ in model.named_parameters()] == ["embed.weight", "block.weight", "block.bias"]
    assert set(model.state_dict()) == {"embed.weight", "block.weight", "block.bias", "head.weight"}


def test_weight_shared_by_two_units_names_both(world):
    model = Tied()
    fully_shard(model.embed, mesh=world)
    with pytest.raises(
        ValueError,
        match=r"parameter head.weight is already managed by another fully_shard unit \(FSDP2's words; weight of "
        r"the fully_shard unit Embedding.*one unit holds every module using it",
    ):
        fully_shard(model, mesh=world)


def test_a_list_of_modules_is_one_unit(world):
    first, second = nn.Linear(8, 8), nn.Linear(8, 4)
    fully_shard([first, second], mesh=world)
    assert first._hp_state is second._hp_state
    assert len(first.sharded_params()) == 4


def test_ignored_params_stay_plain(world):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    keep = model[1].weight
    fully_shard(model, mesh=world, ignored_params={keep})
    assert model[1].weight is keep
    assert len(model.sharded_params()) == 3


def test_shard_placement_fn_picks_the_dim_per_parameter(world):
    """FSDP2's shard_placement_fn: Shard(d) (d < 0 counted from the end) or None (fully_shard's choice) per
    parameter; another mesh for one parameter of a unit is refused with the fix."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, ShardPlacementResult

    layer = fully_shard(nn.Linear(8, 16), mesh=world, shard_placement_fn=lambda p: Shard(-1) if p.ndim == 2 else None)
    assert (layer.weight.placements, layer.bias.placements) == ((Shard(1),), (Shard(0),))
    assert layer.weight.to_local().shape == (16, 1)
    other = init_device_mesh("cpu", (2, 4), mesh_dim_names=("a", "b"))["b"]
    elsewhere = ShardPlacementResult(placement=Shard(0), mesh_info=FSDPMeshInfo(mesh=other, shard_mesh_dim=0))
    with pytest.raises(NotImplementedError, match="another mesh .* per-parameter meshes"):
        fully_shard(nn.Linear(8, 8), mesh=world, shard_placement_fn=lambda p: elsewhere)
    with pytest.raises(ValueError, match="must return Shard"):
        fully_shard(nn.Linear(8, 8), mesh=world, shard_placement_fn=lambda p: Replicate())


def test_containers_without_forward_and_a_second_application_are_refused_as_fsdp2_refuses_them(world):
    """torch FSDP2 refuses an nn.ModuleList / nn.ModuleDict (ValueError) and a second fully_shard on a module
    (AssertionError); ours raises errors catchable as either of torch's types, with the fix."""
    with pytest.raises(ValueError, match="containers that do not implement forward: ModuleList"):
        fully_shard(nn.ModuleList([nn.Linear(8, 8)]), mesh=world)
    with pytest.raises(ValueError, match="containers that do not implement forward: ModuleDict"):
        fully_shard(nn.ModuleDict({"a": nn.Linear(8, 8)}), mesh=world)
    layer = fully_shard(nn.Linear(8, 8), mesh=world)
    for error in (AssertionError, ValueError):
        with pytest.raises(error, match="already been applied .* once per module"):
            fully_shard(layer, mesh=world)


def test_unnamed_meshes_are_read_by_position_as_fsdp2_reads_them(world):
    """FSDP2's docs write fully_shard(m, mesh=init_device_mesh("cpu", (8,))): a 1-D mesh without names shards,
    a 2-D one replicates over dim 0 and shards over dim 1; the view that names them uses the mesh's own
    process groups. A 3-D mesh without names has no such reading and is refused with the fix."""
    flat = fully_shard(nn.Linear(8, 8), mesh=init_device_mesh("cpu", (8,)))
    assert flat.weight.placements == (Shard(0),)
    assert flat.weight.sharded_group_info.size == 8
    two_d = init_device_mesh("cpu", (2, 4))
    hsdp = fully_shard(nn.Linear(8, 8), mesh=two_d)
    assert hsdp.weight.placements == (Replicate(), Shard(0))
    assert (hsdp.weight.unsharded_group_info.size, hsdp.weight.sharded_group_info.size) == (2, 4)
    assert hsdp.weight.device_mesh.get_group(1) is two_d.get_group(1)
    with pytest.raises(ValueError, match="expects a 1D or 2D DeviceMesh.*3-D, without dim names.*mesh_dim_names"):
        fully_shard(nn.Linear(8, 8), mesh=init_device_mesh("cpu", (2, 2, 2)))


def test_explicit_dp_mesh_dims_win_over_names(world):
    """dp_mesh_dims names the data-parallel dims; every other dim is model-parallel, whatever its name."""
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("batch", "shard", "model"))
    roles = resolve_roles(mesh, None, DataParallelMeshDims(shard="shard", replicate="batch"))
    assert (roles.replicate_dims, roles.shard_dim, roles.model_parallel_dims) == (("batch",), "shard", ("model",))
    named = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP))
    roles = resolve_roles(named, None, DataParallelMeshDims(shard="fsdp"))  # dp_replicate becomes model-parallel
    assert (roles.replicate_dims, roles.shard_dim) == ((), "fsdp")
    with pytest.raises(ValueError, match="not found in mesh.mesh_dim_names"):
        resolve_roles(mesh, None, DataParallelMeshDims(shard="fsdp"))
    with pytest.raises(ValueError, match="several shard dims .* flatten them"):
        resolve_roles(mesh, None, DataParallelMeshDims(shard=("batch", "shard")))


def test_spmd_parameter_on_the_whole_mesh(world):
    """A DTensor on the full mesh, Replicate over the dp dims and Shard(0) over tp: fully_shard shards its
    free axis 1 over fsdp, the layout FSDP2's SPMD mode gives it on the same mesh."""
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP))
    layer = nn.Linear(8, 8, bias=False)
    layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Replicate(), Replicate(), Shard(0)]))
    fully_shard(layer, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="fsdp", replicate="dp_replicate"))
    assert layer.weight.placements == (Replicate(), Shard(1), Shard(0))
    bad = nn.Linear(8, 8, bias=False)
    bad.weight = nn.Parameter(distribute_tensor(bad.weight.detach(), mesh, [Replicate(), Shard(1), Shard(0)]))
    with pytest.raises(ValueError, match="Expected Replicate on the data-parallel dim"):
        fully_shard(bad, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="fsdp", replicate="dp_replicate"))


@pytest.mark.parametrize("shape", [(4, 1, 2), (1, 4, 2), (2, 2, 2)])
def test_slices_of_one_mesh_combine_whatever_else_exists(world, shape):
    """TP on mesh["tp"], fully_shard on mesh["dp_replicate", "fsdp"], after other meshes of the same
    shape (ParallelDims views and another init_device_mesh) were built in this process."""
    build_mesh(ParallelDims(world_size=8, dp_shard=4, tp=2), "cpu")
    init_device_mesh("cpu", shape, mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP))
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP))
    layer = nn.Linear(8, 8)
    layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh[MeshDim.TP], [Shard(0)]))
    fully_shard(layer, mesh=mesh[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    names = (MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP)
    assert layer.weight.device_mesh.mesh_dim_names == tuple(n for n, size in zip(names, shape) if size > 1)
    assert layer.weight.placements[-1] == Shard(0)


def test_meta_parameters_become_meta_shards_and_to_empty_relinks_them(world):
    """torchtitan's order: build on meta, fully_shard, to_empty, initialise. The shards are meta until to_empty;
    after it each sharded parameter (the same object) is a view of its padded shard again, so what
    reset_parameters writes is what the all-gather reads."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    fully_shard(model, mesh=world)
    before = list(model.parameters())
    assert all(isinstance(p, DTensor) and p.is_meta for p in before)
    with pytest.raises(RuntimeError, match="meta device.*to_empty"):
        model(torch.zeros(2, 8))
    model.to_empty(device="cpu")
    for module in model:
        module.reset_parameters()
    (group,) = model._hp_state.groups
    assert [p is q for p, q in zip(model.parameters(), before)] == [True] * 4
    for param, sharded in zip(model.parameters(), group.params):
        local = param.to_local()
        assert not local.is_meta and sharded.holds_own_shard(param)
        assert local.untyped_storage().data_ptr() == sharded.padded_shard.untyped_storage().data_ptr()
        assert torch.equal(sharded.padded_shard.narrow(0, 0, local.shape[0]), local)
    assert sum(float(p.to_local().abs().sum()) for p in model.parameters()) > 0


def test_a_frozen_bf16_base_and_trainable_fp32_adapter_share_a_unit(world):
    """QLoRA: one unit, one flat buffer per dtype; before, 'must share a dtype'."""
    base = nn.Linear(8, 8).to(torch.bfloat16).requires_grad_(False)
    model = fully_shard(nn.Sequential(base, nn.Linear(8, 8)), mesh=world)
    assert [g.orig_dtype for g in model._hp_state.groups] == [torch.bfloat16, torch.float32]
    assert [len(g.params) for g in model._hp_state.groups] == [2, 2]


def test_reduce_scatter_unused_params_reaches_every_unit(world):
    """FSDP2's setter, recursive by default (its effect on gradients: tests/test_drop_in_stacks.py)."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    fully_shard(model[0], mesh=world)
    fully_shard(model, mesh=world)
    assert [g.reducer.reduce_unused_params for g in model[0]._hp_state.groups + model._hp_state.groups] == [
        False,
        False,
    ]
    model.set_reduce_scatter_unused_params(True)
    assert [g.reducer.reduce_unused_params for g in model[0]._hp_state.groups + model._hp_state.groups] == [True, True]


def test_the_lifecycle_is_checked(world):
    """A unit's training state changes only along ``step.TRANSITIONS`` (every other move raises, naming
    reset_iter_state) and its parameters only around SHARDED -> GATHERING -> UNSHARDED -> SHARDED (torch FSDP2
    asserts its states the same way)."""
    state = fully_shard(nn.Linear(8, 8), mesh=world)._hp_state
    for now, to in itertools.product(TrainingState, repeat=2):
        state.training_state = now
        if (now, to) in TRANSITIONS:
            state._transition(to)
        else:
            with pytest.raises(RuntimeError, match=f"cannot go from {now.name} to {to.name} .*reset_iter_state"):
                state._transition(to)
        state._transition(TrainingState.IDLE, reset=True)  # the end of a step: from anywhere
        assert state.training_state is TrainingState.IDLE
    group = state.groups[0]
    assert group.sharded_state is ShardedState.SHARDED
    with pytest.raises(RuntimeError, match="cannot go from SHARDED to UNSHARDED"):
        group._move_to(ShardedState.UNSHARDED)  # an unshard must issue its all-gather first


def test_a_forward_that_raises_then_reset_iter_state_leaves_every_unit_idle_and_sharded(world):
    """The second block raises halfway through the forward: the root and the first block are unsharded, the
    second in FORWARD. reset_iter_state (FSDP2's name) resets every unit, and the next step trains."""

    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear, self.fail = nn.Linear(8, 8), True

        def forward(self, x):
            if self.fail:
                raise ValueError("the data loader gave a bad batch")
            return self.linear(x)

    model = nn.Sequential(nn.Linear(8, 8), Fails(), nn.Linear(8, 8))
    for unit in (model[0], model[1], model[2], model):
        fully_shard(unit, mesh=world)
    with pytest.raises(ValueError, match="bad batch"):
        model(torch.randn(4, 8))
    assert model[1]._hp_state.training_state is TrainingState.FORWARD
    model.reset_iter_state()
    for unit in (model[0], model[1], model[2], model):
        assert unit._hp_state.training_state is TrainingState.IDLE
        assert all(group.sharded_state is ShardedState.SHARDED for group in unit._hp_state.groups)
    model[1].fail = False
    model(torch.randn(4, 8)).sum().backward()  # the next step runs
    assert all(unit._hp_state.training_state is TrainingState.IDLE for unit in (model[0], model[1], model[2], model))


def test_to_empty_relinks_a_unit_of_several_modules(world):
    """torchtitan's fully_shard([norm, output]): nn.Module._apply moves norm before output, so the unit relinks
    once both are moved."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 8))
    fully_shard([model[1], model[2]], mesh=world)
    fully_shard(model, mesh=world)
    model.to_empty(device="cpu")
    for group in model[1]._hp_state.groups + model._hp_state.groups:
        group.relink()
        assert all(p.holds_own_shard(p.registered()) and not p.padded_shard.is_meta for p in group.params)


def _subclass_without_extension(shard, mesh) -> dict:
    """A weight of torch's test subclass TwoTensor (``_make_wrapper_subclass``, no fsdp_pre_all_gather /
    fsdp_post_all_gather) sharded by ``shard``, one forward and backward: the classes each stage sees."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    weight = model[0].weight.detach()
    model[0].weight = nn.Parameter(TwoTensor(weight.clone(), 2 * weight))
    shard(model, mesh=mesh)
    seen = []
    model[0].register_forward_pre_hook(lambda module, args: seen.append(type(module.weight).__name__))
    model(torch.ones(2, 8)).sum().backward()
    grad = model[0].weight.grad
    return {
        "shard": type(model[0].weight.to_local()).__name__,
        "forward_weight": seen,
        "grad": (type(grad).__name__, type(grad.to_local()).__name__, tuple(grad.shape)),
    }


def test_a_tensor_subclass_without_the_extension_is_sharded_as_fsdp2_shards_it(world):
    """FSDP2 neither refuses such a parameter nor needs the extension: the shard keeps the subclass, the
    all-gather moves its plain data, the module computes with a plain unsharded parameter and the gradient is
    a plain DTensor. Ours does the same (measured on 2 gloo ranks too: the same losses and parameters as
    FSDP2; the 4-rank drop-in case tensor_subclass_without_extension holds them bit-equal)."""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    assert not hasattr(TwoTensor, "fsdp_pre_all_gather") and not hasattr(TwoTensor, "fsdp_post_all_gather")
    theirs = _subclass_without_extension(torch_fully_shard, world)
    assert theirs == {"shard": "TwoTensor", "forward_weight": ["Parameter"], "grad": ("DTensor", "Tensor", (8, 8))}
    assert _subclass_without_extension(fully_shard, world) == theirs


def test_all_reduce_hook_stream_is_refused_under_hsdp_as_fsdp2_refuses_it(world):
    """FSDP2 runs an all-reduce hook on its own HSDP all-reduce stream, so a stream for it is refused there
    (``ValueError``, FSDP2's words); on a 1-D mesh both accept it."""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    hsdp = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp_replicate", MeshDim.FSDP))
    for shard in (fully_shard, torch_fully_shard):
        with pytest.raises(ValueError, match="^stream cannot be set when using native HSDP$"):
            shard(nn.Linear(8, 8), mesh=hsdp).set_all_reduce_hook(lambda reduced: None, stream=torch.cpu.Stream())
        shard(nn.Linear(8, 8), mesh=world).set_all_reduce_hook(lambda reduced: None, stream=torch.cpu.Stream())
