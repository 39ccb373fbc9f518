"""Drop-in cases from torch's own FSDP2 test suite, about parameters, over 4 ranks (checked by
tests/test_drop_in_fsdp2.py): every case runs once with torch's ``fully_shard`` and once with ours
(``drop_in_training.side_by_side``) and records the largest difference, plus facts a case needs.

* state dict values are views of the sharded parameters: filling them in place loads every parameter,
  biases included (FSDP2's ``test_dp_tp_state_dict_save_load`` / ``test_hsdp_tp_state_dict_save_load``);
* the tensor-subclass all-gather extension (``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``): torch's test
  ``TwoTensor``, the same subclass without the extension (sharded as it is, as FSDP2 does), and a bf16
  all-gather of fp32 weights with uneven rows (a float8 all-gather's shape);
* torchao's float8 training with ``enable_fsdp_float8_all_gather``: the weights' own extension casting each
  shard to e4m3 (its amax all-reduced over the shard ranks) before the all-gather;
* fp16 compute with fp16 gradient reduction (FSDP2 divides by about sqrt(ranks) before and after);
* ``shard_placement_fn``: the largest dim of every parameter, dim 1 of every matrix, and torchtitan's expert
  parallel path (experts ``Shard(1)`` on efsdp, ``ExpertParallel`` on ep).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from drop_in_training import (
    case,
    global_losses,
    random_inputs,
    shard_per_block,
    side_by_side,
    tokens,
    train,
    train_steps,
    transformer,
    world_mesh,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.testing._internal.common_fsdp import MLP
from torch.testing._internal.distributed._tensor.common_dtensor import ExpertParallel
from torch.testing._internal.two_tensor import TwoTensor

from hyper_parallel.mesh_dims import MeshDim

FILL = 42.0


def _mlp_stack(shard, mesh, tp_mesh=None, dim: int = 6) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[MLP(dim) for _ in range(3)])
    if tp_mesh is not None:
        plan = {
            f"{i}.{name}": style()
            for i in range(3)
            for name, style in (("in_proj", ColwiseParallel), ("out_proj", RowwiseParallel))
        }
        parallelize_module(model, tp_mesh, plan)
    for mlp in model:
        shard(mlp, mesh=mesh)
    shard(model, mesh=mesh)
    return model


def _filled_in_place(shard, mesh, tp_mesh=None) -> dict:
    model = _mlp_stack(shard, mesh, tp_mesh)
    state = model.state_dict()
    views = all(state[name].to_local().data_ptr() == p.to_local().data_ptr() for name, p in model.named_parameters())
    with torch.no_grad():
        for value in state.values():
            value.fill_(FILL)
    off = max(float((p.full_tensor() - FILL).abs().max()) for p in model.parameters())
    return {"params": list(model.parameters()), "views": views, "largest_off_fill": off}


@case
def state_dict_loads_in_place():
    """FSDP2's save/load tests: every state dict value shares storage with its parameter, so an in-place load
    (DCP's) reaches the biases too; on (dp 2, tp 2) with torch's TP plan and on HSDP (2, 2)."""
    dp_tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", MeshDim.TP))
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.DP_SHARD))
    return {
        "dp_tp": side_by_side(lambda shard: _filled_in_place(shard, dp_tp["dp"], dp_tp[MeshDim.TP])),
        "hsdp": side_by_side(lambda shard: _filled_in_place(shard, hsdp)),
    }


class GatherCount:
    """How many times each ``fsdp_pre_all_gather`` of one run was called, and the shard meshes it was given."""

    def __init__(self) -> None:
        self.calls, self.mesh_sizes = 0, set()

    def pre_all_gather(self, local, mesh, outer_size, outer_stride, module, mp_policy):
        self.calls += 1
        self.mesh_sizes.add((mesh.ndim, mesh.size()))
        return (local.a, local.b), None

    @staticmethod
    def post_all_gather(local, outputs, metadata, param_dtype, *, out=None):
        a, b = outputs
        if out is not None:  # the outputs are the kept gathered tensors: out already holds them
            return None
        return TwoTensor(a, b).to(param_dtype), (a, b)


def _two_tensor_run(shard, mesh, count: GatherCount) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(*[MLP(8, bias=False) for _ in range(2)])
    for mlp in model:
        for linear in (mlp.in_proj, mlp.out_proj):
            linear.weight = nn.Parameter(TwoTensor(linear.weight.detach(), linear.weight.detach().clone()))
        shard(mlp, mesh=mesh)
    shard(model, mesh=mesh)

    def pre_all_gather(local, mesh, outer_size, outer_stride, module, mp_policy):
        return count.pre_all_gather(local, mesh, outer_size, outer_stride, module, mp_policy)

    TwoTensor.fsdp_pre_all_gather = pre_all_gather
    TwoTensor.fsdp_post_all_gather = GatherCount.post_all_gather
    try:
        result = train_steps(model, random_inputs((2, 8)))
    finally:
        del TwoTensor.fsdp_pre_all_gather, TwoTensor.fsdp_post_all_gather
    result["params"] = [p.full_tensor().a for p in result["params"]]
    result["grads"] = [g.full_tensor() for g in result["grads"]]
    result["pre_all_gather_calls"], result["shard_meshes"] = count.calls, sorted(count.mesh_sizes)
    return result


@case
def tensor_subclass_all_gather():
    """torch's test TwoTensor (two tensors per weight, both all-gathered): FSDP2's extension called on every
    all-gather, on the shard dim's 1-D mesh (HSDP (2, 2): 2 ranks), trained bit-equal."""
    fsdp = init_device_mesh("cpu", (4,), mesh_dim_names=(MeshDim.FSDP,))
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.DP_SHARD))
    return {
        "fsdp": side_by_side(lambda shard: _two_tensor_run(shard, fsdp, GatherCount())),
        "hsdp": side_by_side(lambda shard: _two_tensor_run(shard, hsdp, GatherCount())),
    }


def _without_extension_run(shard) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(*[MLP(8, bias=False) for _ in range(2)])
    for mlp in model:
        weight = mlp.in_proj.weight.detach()
        mlp.in_proj.weight = nn.Parameter(TwoTensor(weight.clone(), 2 * weight))
        shard(mlp)
    shard(model)
    result = train_steps(model, random_inputs((2, 8)))
    full = [p.full_tensor() for p in result["params"]]
    result["params"] = [t for p in full for t in ((p.a, p.b) if isinstance(p, TwoTensor) else (p,))]
    result["shards"] = sorted({type(p.to_local()).__name__ for p in model.parameters()})
    return result


@case
def tensor_subclass_without_extension():
    """TwoTensor weights without fsdp_pre_all_gather / fsdp_post_all_gather: FSDP2 shards them as they are
    (the shard keeps the subclass, the all-gather moves its plain data); ours the same, trained bit-equal."""
    assert not hasattr(TwoTensor, "fsdp_pre_all_gather")
    return side_by_side(_without_extension_run)


def _bf16_gather(local, mesh, outer_size, outer_stride, module, mp_policy):
    """All-gather a bf16 copy of the fp32 shard, padded to the padded shard's rows (float8's shape)."""
    rows = -(-outer_size[0] // mesh.size())
    padded = torch.zeros((rows, *outer_size[1:]), dtype=torch.bfloat16)
    padded[: local.shape[0]].copy_(local)
    return (padded,), None


def _bf16_upcast(local, outputs, metadata, param_dtype, *, out=None):
    (gathered,) = outputs
    if out is not None:  # the unsharded parameter, without the padding rows
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(out):
            out.copy_(gathered[: out.shape[0]])
        return None
    upcast = gathered.to(param_dtype)
    return upcast, (gathered, upcast)


def _bf16_gather_run(shard) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 9), nn.ReLU(), nn.Linear(9, 3))  # 9 and 3 rows over 4 ranks: padded
    shard(model, reshard_after_forward=False)
    for name, param in model.named_parameters():
        if name.endswith("weight"):
            local = param._local_tensor
            local.fsdp_pre_all_gather = _bf16_gather.__get__(local)
            local.fsdp_post_all_gather = _bf16_upcast.__get__(local)
    return train_steps(model, random_inputs((2, 3)))


@case
def bf16_all_gather_of_uneven_rows():
    """The extension attached to plain local tensors (FSDP2's monkey-patch test): weights of 9 and 3 rows over
    4 ranks all-gathered in bf16 from padded inputs, computed in fp32."""
    return side_by_side(_bf16_gather_run)


@case
def fp16_compute_and_reduction():
    """MixedPrecisionPolicy(param_dtype=fp16): gradients reduced in fp16, divided by 2 before the reduce-scatter
    and by 2 after on 4 ranks, as FSDP2 divides them (FSDP2's test_compute_dtype)."""

    def run(shard):
        torch.manual_seed(0)
        model = nn.Sequential(*[MLP(16) for _ in range(3)])
        policy = MixedPrecisionPolicy(param_dtype=torch.float16)
        for mlp in model:
            shard(mlp, mp_policy=policy)
        shard(model, mp_policy=policy)
        return train_steps(model, random_inputs((4, 16), torch.float16))

    return side_by_side(run)


def _largest_dim(param: nn.Parameter) -> Shard:
    return Shard(param.shape.index(max(param.shape)))


@case
def shard_placement_fn_per_parameter():
    """FSDP2's shard_placement_fn: every parameter of torch's test Transformer on its largest dim; every matrix of
    an MLP stack on dim 1 (torch's contiguity test)."""

    def largest(shard):
        model = transformer(weight_tying=False)
        for layer in model.layers:
            shard(layer, shard_placement_fn=_largest_dim)
        shard(model, shard_placement_fn=_largest_dim)
        _, local = tokens(dist.get_rank(), 4)
        result = train_steps(model, [local[:, :-1]] * 3)
        result["placements"] = sorted({str(p.placements) for p in model.parameters()})
        return result

    def dim_one(shard):
        torch.manual_seed(0)
        model = nn.Sequential(*[MLP(8) for _ in range(2)])
        fn = lambda p: Shard(1) if p.ndim > 1 else Shard(0)  # noqa: E731
        for mlp in model:
            shard(mlp, shard_placement_fn=fn)
        shard(model, shard_placement_fn=fn)
        result = train_steps(model, random_inputs((2, 8)))
        result["contiguous"] = all(
            p.to_local().is_contiguous() and p.grad.to_local().is_contiguous()
            for p in model.parameters()
            if p.grad is not None
        )
        return result

    return {"largest_dim": side_by_side(largest), "dim_one": side_by_side(dim_one)}


@case
def experts_sharded_on_dim_one():
    """torchtitan's expert-parallel path: ExpertParallel on ep, the experts a unit on efsdp with
    shard_placement_fn=Shard(1) (torchtitan passes one whenever EP > 1), the dense parts on fsdp."""
    sparse = init_device_mesh("cpu", (2, 2), mesh_dim_names=(MeshDim.EFSDP, MeshDim.EP))
    dense = init_device_mesh("cpu", (4,), mesh_dim_names=(MeshDim.FSDP,))

    def run(shard):
        model = transformer(weight_tying=False, num_experts=4)
        for layer in model.layers:
            experts = layer.expert_layer.experts
            parallelize_module(experts, sparse[MeshDim.EP], ExpertParallel())
            shard(experts, mesh=sparse[MeshDim.EFSDP], shard_placement_fn=lambda p: Shard(1))
            shard(layer, mesh=dense)
        shard(model, mesh=dense)
        _, local = tokens(dist.get_rank(), 4)
        result = train_steps(model, [local[:, :-1]] * 3, loss_fn=lambda out: F.log_softmax(out.float(), -1).mean())
        result["expert_placements"] = [str(p) for p in model.layers[0].expert_layer.experts.w1.placements]
        return result

    return side_by_side(run)


def _float8_transformer_run(shard, calls: list) -> dict:
    """torch's test Transformer with every block linear converted by torchao (tensorwise scales, float8 weight
    all-gather), sharded per block + root; ``calls`` collects the dtypes each ``fsdp_pre_all_gather`` returned."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    model = transformer(weight_tying=False)
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda _, fqn: fqn.startswith("layers."))
    shard_per_block(model, shard, world_mesh())
    original = WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather

    def counted(self, mesh):
        inputs, metadata = original(self, mesh)
        calls.append(tuple(str(t.dtype) for t in inputs))
        return inputs, metadata

    WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather = counted
    try:
        _, local = tokens(dist.get_rank(), dist.get_world_size())
        result = train(model, local)
    finally:
        WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather = original
    result["losses"] = torch.tensor(global_losses(result["losses"], distributed=True))
    result["grads"] = [g for grads in result["grads"] for _, g in sorted(grads.items())]
    result["params"] = [p for _, p in sorted(result["params"].items())]
    result["weight_shards"] = sorted({type(p.to_local()).__name__ for p in model.parameters()})
    result["pre_all_gather_calls"], result["gathered_dtypes"] = len(calls), sorted(set(calls))
    return result


def _m4_float8_run(shard) -> dict:
    """Recipe M4-F8's model, seed, batch rows and SGD step (recipes/dense.py), sharded by ``shard``."""
    from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch
    from hyper_parallel.parallel.float8 import convert_to_float8

    config, rank, ranks = MLPConfig(), dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = convert_to_float8(MLP(config), enable_fsdp_float8_all_gather=True)
    for block in model.blocks:
        shard(block, mesh=world_mesh())
    shard(model, mesh=world_mesh())
    x, y = mlp_batch(config, 16, 0)
    rows = slice(rank * 16 // ranks, (rank + 1) * 16 // ranks)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, grads = [], []
    for _ in range(3):
        loss = F.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        grads += [p.grad.full_tensor() for p in model.parameters()]
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return {"losses": losses, "grads": grads, "params": list(model.parameters())}


@case
def torchao_float8_all_gather():
    """torchao's float8 training (convert_to_float8_training, enable_fsdp_float8_all_gather=True) under each
    fully_shard: on torch's test Transformer, 2 blocks x 6 float8 weights x 3 steps x (forward + backward) = 72
    calls of the weights' fsdp_pre_all_gather per rank, each gathering e4m3 data only, trained with AdamW; and
    recipe M4-F8's MLP, seed and batch with its SGD steps."""
    return {
        "transformer": side_by_side(lambda shard: _float8_transformer_run(shard, [])),
        "m4_f8": side_by_side(_m4_float8_run),
    }
