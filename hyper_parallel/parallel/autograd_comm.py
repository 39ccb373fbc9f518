"""Named autograd functions, one per communication step of tensor / sequence parallelism.

Each pairs a forward collective with its adjoint in backward (Megatron-LM, picotron):

    copy_to_tp          forward identity            backward all-reduce
    reduce_from_tp      forward all-reduce          backward identity
    scatter_to_sp       forward keep my chunk       backward all-gather
    gather_from_sp      forward all-gather          backward reduce-scatter (grad partial: feeds a
                                                    colwise layer) or keep my chunk (grad replicated)
    reduce_scatter_to_sp  forward reduce-scatter    backward all-gather

Sequence chunks are along ``dim`` in rank order of the group.
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


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, info):
        ctx.info = info
        return tensor

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.contiguous().clone(), ctx.info), None


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, info):
        return comm.all_reduce(tensor.contiguous().clone(), info)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dim, info):
        ctx.dim, ctx.info = dim, info
        return chunk_along(tensor, dim, info)

    @staticmethod
    def backward(ctx, grad):
        return gather_along(grad, ctx.dim, ctx.info), None, None


class GatherFromSequenceParallel(torch.autograd.Function):
    """``grad_is_partial``: True when the gathered tensor feeds a colwise layer (each rank's input
    gradient is a partial sum: reduce-scatter it); False when every rank computes the same thing on
    it (the gradient is replicated: keep this rank's chunk)."""

    @staticmethod
    def forward(ctx, tensor, dim, info, grad_is_partial=True):
        ctx.dim, ctx.info, ctx.grad_is_partial = dim, info, grad_is_partial
        return gather_along(tensor, dim, info)

    @staticmethod
    def backward(ctx, grad):
        if ctx.grad_is_partial:
            return reduce_scatter_along(grad, ctx.dim, ctx.info), None, None, None
        return chunk_along(grad, ctx.dim, ctx.info), None, None, None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dim, info):
        ctx.dim, ctx.info = dim, info
        return reduce_scatter_along(tensor, dim, info)

    @staticmethod
    def backward(ctx, grad):
        return gather_along(grad, ctx.dim, ctx.info), None, None
