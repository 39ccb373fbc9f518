"""Dense recipes on the MLP: M1 (DDP via fully_shard) and M4 (FSDP only)."""

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
    dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions, enable_param_shard: bool | None
) -> Workload:
    config = MLPConfig()
    with seeded_on_host(seed):
        model = MLP(config)
    reference = copy.deepcopy(model)
    mesh = views[MeshDim.DP_REPLICATE, MeshDim.FSDP]
    for block in model.blocks:
        fully_shard(block, mesh=mesh, enable_param_shard=enable_param_shard)
    fully_shard(model, mesh=mesh, enable_param_shard=enable_param_shard)
    x, y = mlp_batch(config, options.global_batch, seed)
    return Workload(
        model, reference, (data_parallel_rows(x, dims),), data_parallel_rows(y, dims), (x,), y, loss_fn=F.mse_loss
    )


def ddp_mlp(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M1: whole parameters on every rank, gradients all-reduced over dp_replicate x dp_shard."""
    return _mlp_workload(dims, views, seed, options, enable_param_shard=False)


def fsdp_mlp(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M4: parameters sharded over dp_shard; all-gather / reduce-scatter per block."""
    return _mlp_workload(dims, views, seed, options, enable_param_shard=None)
