"""Named autograd functions, one per communication step of TP, SP, CP and EP.

Each pairs a forward collective with its adjoint in backward (Megatron-LM, picotron):

    AllReduceBackward                    forward identity         backward all-reduce     (Megatron's f,
                                         ``copy_to_tensor_model_parallel_region``)
    AllReduceForward                     forward all-reduce       backward identity       (g,
                                         ``reduce_from_tensor_model_parallel_region``)
    SplitWithAllGatherBackward           forward keep my chunk    backward all-gather
                                         (``scatter_to_sequence_parallel_region``)
    AllGatherWithReduceScatterBackward   forward all-gather       backward reduce-scatter (the gradient is
                                         partial: it feeds a colwise layer; ``gather_from_sequence_parallel_region``)
    AllGatherWithSplitBackward           forward all-gather       backward keep my chunk  (the gradient is
                                         replicated: every rank uses the gathered tensor alike)
    ReduceScatterWithAllGatherBackward   forward reduce-scatter   backward all-gather
                                         (``reduce_scatter_to_sequence_parallel_region``)

Named by what they do, not by the style that first used them: CP's K/V gather and EP's row exchange
use them too. Chunks are along ``dim`` in rank order of the group.
"""

from __future__ import annotations

import torch

from hyper_parallel import comm
from hyper_parallel.comm import GroupInfo


def gather_along(tensor: torch.Tensor, dim: int, info: GroupInfo) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along ``dim`` (one all-gather)."""
    moved = tensor.movedim(dim, 0).contiguous()
    out = torch.empty((info.size * moved.shape[0],) + tuple(moved.shape[1:]), dtype=moved.dtype, device=moved.device)
    comm.all_gather_into_tensor(out, moved, info)
    return out.movedim(0, dim)


def reduce_scatter_along(tensor: torch.Tensor, dim: int, info: GroupInfo) -> torch.Tensor:
    """Sum over ranks, keep this rank's chunk along ``dim`` (one reduce-scatter)."""
    moved = tensor.movedim(dim, 0).contiguous()
    if moved.shape[0] % info.size:
        raise ValueError(
            f"dim {dim} of size {moved.shape[0]} does not split evenly over {info.size} ranks of {info.name}"
        )
    out = torch.empty((moved.shape[0] // info.size,) + tuple(moved.shape[1:]), dtype=moved.dtype, device=moved.device)
    comm.reduce_scatter_tensor(out, moved, info)
    return out.movedim(0, dim)


def chunk_along(tensor: torch.Tensor, dim: int, info: GroupInfo) -> torch.Tensor:
    if tensor.shape[dim] % info.size:
        raise ValueError(
            f"dim {dim} of size {tensor.shape[dim]} does not split evenly over {info.size} ranks of {info.name}"
        )
    return tensor.chunk(info.size, dim=dim)[info.index].contiguous()


class AllReduceBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, info):
        ctx.info = info
        return tensor

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.contiguous().clone(), ctx.info), None


class AllReduceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, info):
        return comm.all_reduce(tensor.contiguous().clone(), info)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class SplitWithAllGatherBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dim, info):
        ctx.dim, ctx.info = dim, info
        return chunk_along(tensor, dim, info)

    @staticmethod
    def backward(ctx, grad):
        return gather_along(grad, ctx.dim, ctx.info), None, None


class _AllGatherAlong(torch.autograd.Function):
    """The forward both all-gathers share; a subclass says what its backward does."""

    @staticmethod
    def forward(ctx, tensor, dim, info):
        ctx.dim, ctx.info = dim, info
        return gather_along(tensor, dim, info)


class AllGatherWithReduceScatterBackward(_AllGatherAlong):
    """All-gather along ``dim``; backward reduce-scatters. For a gathered tensor that feeds a colwise
    layer: each rank's gradient of it is a partial sum (Megatron's ``gather_from_sequence_parallel_region``,
    ``tensor_parallel_output_grad=True``)."""

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along(grad, ctx.dim, ctx.info), None, None


class AllGatherWithSplitBackward(_AllGatherAlong):
    """All-gather along ``dim``; backward keeps this rank's chunk. For a gathered tensor every rank
    uses the same way: its gradient is replicated (``tensor_parallel_output_grad=False``)."""

    @staticmethod
    def backward(ctx, grad):
        return chunk_along(grad, ctx.dim, ctx.info), None, None


class ReduceScatterWithAllGatherBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dim, info):
        ctx.dim, ctx.info = dim, info
        return reduce_scatter_along(tensor, dim, info)

    @staticmethod
    def backward(ctx, grad):
        return gather_along(grad, ctx.dim, ctx.info), None, None
