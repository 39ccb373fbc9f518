"""Megatron-style tensor + sequence parallelism on local tensors, for the pure-TP fix (docs/design.md §3).

Parameters are DTensors on the tp mesh (so fully_shard sees their layout: w1 ``Shard(0)``, w2
``Shard(1)``, norm weight and w2 bias ``Replicate()``), but forward computes on ``to_local()``
tensors with explicit collectives. Between blocks activations are sequence-sharded:

    x[s/tp] -> norm -> all-gather(seq) -> w1 (colwise) -> relu -> w2 (rowwise) -> reduce-scatter(seq) -> + bias -> + x

The norm weight and the w2 bias act on this rank's sequence chunk only, so their local gradients
are *partial* sums over tp although their DTensor layout says Replicate: autograd on local tensors
cannot know. Declaring them (``mark_partial_grads=True``) lets fully_shard sum them over tp;
without it every tp rank keeps a different gradient and the replicas drift apart.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from hyper_parallel.comm import GroupInfo
from hyper_parallel.models.layers import rms_norm
from hyper_parallel.models.mlp import MLP, MLPBlock
from hyper_parallel.parallel.autograd_comm import (
    AllGatherWithReduceScatterBackward,
    AllGatherWithSplitBackward,
    ReduceScatterWithAllGatherBackward,
    SplitWithAllGatherBackward,
)
from hyper_parallel.partial_grad import mark_partial

SEQ_DIM = 1


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _distribute(module: nn.Module, name: str, mesh: DeviceMesh, placement, partial: bool) -> None:
    param = getattr(module, name)
    dtensor = nn.Parameter(
        distribute_tensor(param.detach(), mesh, [placement], src_data_rank=None), requires_grad=param.requires_grad
    )
    if partial:
        mark_partial(dtensor, mesh.mesh_dim_names[0])
    module._parameters[name] = dtensor


class LocalTensorParallelMLPBlock(nn.Module):
    """An MLPBlock computing on local shards; keeps the block's submodule names (norm, w1, w2)."""

    def __init__(self, block: MLPBlock, tp: GroupInfo) -> None:
        super().__init__()
        self.norm, self.w1, self.w2, self.tp = block.norm, block.w1, block.w2, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, _local(self.norm.weight), self.norm.eps)
        h = AllGatherWithReduceScatterBackward.apply(h, SEQ_DIM, self.tp)
        h = torch.relu(F.linear(h, _local(self.w1.weight), _local(self.w1.bias)))
        h = ReduceScatterWithAllGatherBackward.apply(F.linear(h, _local(self.w2.weight)), SEQ_DIM, self.tp)
        return x + h + _local(self.w2.bias)


class LocalTensorParallelMLP(nn.Module):
    """The MLP with sequence-parallel blocks; input projection and head run replicated on the full sequence."""

    def __init__(self, model: MLP, tp: GroupInfo, blocks: nn.ModuleList) -> None:
        super().__init__()
        self.inp, self.blocks, self.head, self.tp = model.inp, blocks, model.head, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = SplitWithAllGatherBackward.apply(self.inp(x), SEQ_DIM, self.tp)
        for block in self.blocks:
            x = block(x)
        return self.head(AllGatherWithSplitBackward.apply(x, SEQ_DIM, self.tp))


def parallelize_mlp_local(model: MLP, tp_mesh: DeviceMesh, mark_partial_grads: bool = True) -> LocalTensorParallelMLP:
    """Shard ``model``'s blocks over ``tp_mesh`` (1-D) in the local-tensor style; returns the new model.

    ``mark_partial_grads=False`` reproduces the bug the fix removes: the norm weight and w2 bias
    gradients stay partial over tp.
    """
    if tp_mesh.ndim != 1:
        raise ValueError(f"parallelize_mlp_local needs a 1-D tp mesh, got dims {tp_mesh.mesh_dim_names}")
    if model.config.seq_len % tp_mesh.size():
        raise ValueError(
            f"seq_len={model.config.seq_len} must be divisible by tp={tp_mesh.size()} for sequence parallelism"
        )
    tp = GroupInfo.from_mesh(tp_mesh, tuple(tp_mesh.mesh_dim_names))
    blocks = nn.ModuleList()
    for block in model.blocks:
        _distribute(block.norm, "weight", tp_mesh, Replicate(), partial=mark_partial_grads)
        _distribute(block.w1, "weight", tp_mesh, Shard(0), partial=False)
        _distribute(block.w1, "bias", tp_mesh, Shard(0), partial=False)
        _distribute(block.w2, "weight", tp_mesh, Shard(1), partial=False)
        _distribute(block.w2, "bias", tp_mesh, Replicate(), partial=mark_partial_grads)
        blocks.append(LocalTensorParallelMLPBlock(block, tp))
    return LocalTensorParallelMLP(model, tp, blocks)
