"""Dense recipes on the MLP: M1 (DDP via fully_shard), M4 (FSDP only) and M4-F8 (M4 in float8)."""

from __future__ import annotations

import copy

import torch.nn.functional as F

from hyper_parallel.devices import seeded_on_host
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import MeshViews
from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch
from hyper_parallel.recipes.batches import data_parallel_rows
from hyper_parallel.recipes.options import RunOptions
from hyper_parallel.recipes.training import Workload


def _mlp_workload(
    dims: ParallelDims,
    views: MeshViews,
    seed: int,
    options: RunOptions,
    enable_param_shard: bool | None,
    float8: bool = False,
) -> Workload:
    """``float8``: the block linears in float8 with float8 all-gathers of their weights (M4-F8), the reference
    the same model in float8 on one process."""
    config = MLPConfig()
    with seeded_on_host(seed):
        model = MLP(config)
    reference = copy.deepcopy(model)
    if float8:
        from hyper_parallel.parallel.float8 import convert_to_float8

        convert_to_float8(reference)
        convert_to_float8(model, enable_fsdp_float8_all_gather=True)
    mesh = views[MeshDim.DP_REPLICATE, MeshDim.FSDP]
    for block in model.blocks:
        fully_shard(block, mesh=mesh, enable_param_shard=enable_param_shard)
    fully_shard(model, mesh=mesh, enable_param_shard=enable_param_shard)
    x, y = mlp_batch(config, options.global_batch, seed)
    workload = Workload(
        model, reference, (data_parallel_rows(x, dims),), data_parallel_rows(y, dims), (x,), y, loss_fn=F.mse_loss
    )
    if float8:  # inputs and output gradients scale by each dp rank's own amax: the reference steps per dp rank
        workload.reference_slices = dims.dp
    return workload


def ddp_mlp(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M1: whole parameters on every rank, gradients all-reduced over dp_replicate x dp_shard."""
    return _mlp_workload(dims, views, seed, options, enable_param_shard=False)


def fsdp_mlp(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M4: parameters sharded over dp_shard; all-gather / reduce-scatter per block."""
    return _mlp_workload(dims, views, seed, options, enable_param_shard=None)


def float8_fsdp_mlp(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M4-F8: M4 with the block linears in float8 (torchao, tensorwise scales) whose weights fully_shard
    all-gathers in float8 through FSDP2's tensor-subclass extension: each shard cast with the scale of the
    whole weight (amax all-reduced over the shard ranks), 1 byte per value on the wire. The reference is the
    same model in float8 on one process (the same weight scales; activation and gradient scales per dp rank,
    so it steps on each dp rank's rows separately): equal to float32 rounding."""
    return _mlp_workload(dims, views, seed, options, enable_param_shard=None, float8=True)
