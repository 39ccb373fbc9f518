"""Expert parallelism (EP) and expert tensor parallelism (ETP) by all-to-all, for ``hyper_parallel.models.moe.MoE``.

``parallelize_moe(moe, mesh)`` keeps the MoE's routing, sorting and combining and replaces its
``experts(routed, counts)`` step (tokens sorted by global expert id, ``counts [num_experts]``), with the
default ``dispatch="all_to_all"``, by:

    routed [N, d] sorted by expert, counts [E]
      -> all_to_all(counts) over ep             each rank learns how many rows it gets per local expert
      -> DispatchTokens: all_to_all(rows) over ep, uneven splits    (backward: the reverse all_to_all)
      -> regroup the received rows expert-major (source rank order inside an expert)
      [-> AllReduceBackward over etp          forward identity, backward all-reduce of the input grad]
      -> local experts on ``to_local()`` weights (ETP: w1 colwise / w2 rowwise hidden shard)
      [-> AllReduceForward over etp          forward all-reduce of the partial outputs, backward identity]
      -> back to source-rank order
      -> CombineTokens: the reverse all_to_all over ep               (backward: the forward all_to_all)
    rows back in the caller's order; the MoE weights and sums them per token as in the reference.

``dispatch="all_gather"`` (``hyper_parallel.parallel.ep.all_gather``, Megatron's allgather token
dispatcher) exchanges the same rows differently: every rank all-gathers the (padded) routed rows of its
ep group, runs its local experts on the rows routed to them, writes zeros for the others, and a
reduce-scatter returns each source rank its rows. Same parameters, same rows per expert in the same
order, so the same outputs and gradients (up to float reordering); ep times the traffic of all-to-all.

Layouts. ``experts.w1 [E, d, h]`` and ``experts.w2 [E, h, d]`` become DTensor Parameters: ``Shard(0)``
on ep (rank i of the ep group holds experts ``[i*E/ep, (i+1)*E/ep)``), with ETP additionally
``Shard(2)`` (w1, colwise) and ``Shard(1)`` (w2, rowwise) on etp. The router and the shared expert stay
plain (replicated) parameters.

Collectives per MoE layer (what ``hyper_parallel.trace`` records; a group of size 1 records nothing):

dispatch="all_to_all" (default)
    forward    1 all_to_all (counts, int64, even splits)  + 2 all_to_all (tokens: dispatch, combine)  on ep
               [+ 1 all_reduce on etp]  [+ 1 all_gather on the token-split group]
    backward   2 all_to_all (the reverse of combine, then of dispatch)                              on ep
               [+ 1 all_reduce on etp (input gradient of the colwise w1)]
               [+ 1 all_gather on the token-split group (input gradient)]

dispatch="all_gather" (C = the largest routed-row count of the ep group; each rank pads to it)
    forward    1 all_gather (counts, int64, ep x E)  + 1 all_gather (rows, ep x C)
               + 1 reduce_scatter (outputs, ep x C)                                              on ep
               [+ 1 all_reduce on etp]  [+ 1 all_gather on the token-split group]
    backward   1 all_gather (output gradient) + 1 reduce_scatter (input gradient)               on ep
               [+ 1 all_reduce on etp]  [+ 1 all_gather on the token-split group]
    Issue order: forward counts, rows, [etp], outputs, [split]; backward all_gather, [etp],
    reduce_scatter, [split]. No all_to_all.

The split sizes (all-gather: the capacity C and the local expert counts) come from the counts as
Python ints (``.tolist()``): a device-to-host sync per layer on GPU, the reason TorchTitan needs
explicit prefetch around MoE blocks.

Preconditions (not checkable cheaply at run time, so documented):
* the ranks of an ep group hold DIFFERENT tokens (EP borrows ranks from dp_shard / cp, and with
  etp == 1 also from tp). Tokens replicated inside the ep group would be computed twice by the experts
  and their expert gradients counted twice. When the ep group contains tp ranks that hold the same
  tokens (etp == 1, no sequence parallelism), pass ``token_split_mesh=views["tp"]``: each rank of that
  group then keeps 1/size of the sequence (``seq_len % size == 0``) before routing and the outputs are
  all-gathered after the combine (``SplitWithAllGatherBackward`` / ``AllGatherWithSplitBackward``:
  backward keeps this rank's chunk of the output gradient and all-gathers the input gradient). The
  router and shared expert then see only this rank's chunk, so their gradients are partial sums over
  that group: they are marked (``hyper_parallel.partial_grad``) and ``fully_shard`` sums them over it.
* with ETP (etp == tp) every rank of an etp group holds the same tokens (and routes them identically):
  each computes its hidden-dim shard of the same rows and the partial outputs are summed.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from hyper_parallel import comm
from hyper_parallel.comm import GroupInfo
from hyper_parallel.models.moe import GroupedExperts, grouped_mlp
from hyper_parallel.parallel.autograd_comm import AllReduceBackward, AllReduceForward

SEQ_DIM = 1


class _TokenAllToAll(torch.autograd.Function):
    """Rows to every rank of the group with uneven splits; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, rows, info, output_splits, input_splits):
        ctx.info, ctx.output_splits, ctx.input_splits = info, output_splits, input_splits
        out = rows.new_empty((sum(output_splits),) + tuple(rows.shape[1:]))
        return comm.all_to_all_single(out, rows.contiguous(), info, output_splits, input_splits)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = grad.new_empty((sum(ctx.input_splits),) + tuple(grad.shape[1:]))
        comm.all_to_all_single(out, grad, ctx.info, ctx.input_splits, ctx.output_splits)
        return out, None, None, None


class DispatchTokens(_TokenAllToAll):
    """Forward: routed rows to the ep ranks owning their experts. Backward: their gradients back to the source."""


class CombineTokens(_TokenAllToAll):
    """Forward: expert outputs back to the ranks that routed them. Backward: output gradients to the experts."""


def exchange_counts(counts: torch.Tensor, ep: GroupInfo) -> torch.Tensor:
    """``counts [E]`` (rows this rank sends per global expert) -> ``[ep, E/ep]``: row j holds the rows
    rank j of the group sends to each of this rank's local experts. One even all_to_all (no autograd)."""
    received = torch.empty_like(counts)
    comm.all_to_all_single(received, counts.contiguous(), ep)
    return received.view(ep.size, -1)


def expert_major_order(received_counts: torch.Tensor) -> torch.Tensor:
    """Permutation regrouping the received rows (source-rank major, then local expert) expert-major,
    keeping source-rank order (and each source's row order) inside an expert."""
    sources, local = received_counts.shape
    segment = torch.repeat_interleave(
        torch.arange(sources * local, device=received_counts.device), received_counts.reshape(-1)
    )
    key = (segment % local) * sources + torch.div(segment, local, rounding_mode="floor")
    return torch.argsort(key, stable=True)


def _inverse(permutation: torch.Tensor) -> torch.Tensor:
    inverse = torch.empty_like(permutation)
    inverse[permutation] = torch.arange(permutation.numel(), device=permutation.device)
    return inverse


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor weight (experts compute on local tensors)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class ExpertParallelExperts(nn.Module):
    """Drop-in for ``GroupedExperts`` (same ``forward(routed, counts)`` and parameter names ``w1``/``w2``)
    holding this rank's experts and exchanging the tokens over ep with all-to-all (see the module docstring).
    ``ep.all_gather.AllGatherExpertParallelExperts`` subclasses it and only replaces ``forward``."""

    dispatch = "all_to_all"

    def __init__(self, experts: GroupedExperts, mesh: DeviceMesh, ep: GroupInfo, etp: GroupInfo | None) -> None:
        super().__init__()
        self.num_experts = experts.num_experts
        self.ep, self.etp = ep, etp
        w1_placements = [Shard(0)] + ([Shard(2)] if etp is not None else [])
        w2_placements = [Shard(0)] + ([Shard(1)] if etp is not None else [])
        for name, placements in (("w1", w1_placements), ("w2", w2_placements)):
            param = getattr(experts, name)
            dtensor = distribute_tensor(param.detach(), mesh, placements, src_data_rank=None)
            self.register_parameter(name, nn.Parameter(dtensor, requires_grad=param.requires_grad))

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.ep.size

    def forward(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ep = self.ep
        received_counts = exchange_counts(counts, ep)  # [ep, E/ep]
        input_splits = counts.view(ep.size, -1).sum(1).tolist()
        output_splits = received_counts.sum(1).tolist()
        received = DispatchTokens.apply(routed, ep, output_splits, input_splits)
        order = expert_major_order(received_counts)
        rows = received[order]
        if self.etp is not None:
            rows = AllReduceBackward.apply(rows, self.etp)
        out = grouped_mlp(rows, received_counts.sum(0).tolist(), local_tensor(self.w1), local_tensor(self.w2))
        if self.etp is not None:
            out = AllReduceForward.apply(out, self.etp)
        out = out[_inverse(order)]
        return CombineTokens.apply(out, ep, input_splits, output_splits)

    def extra_repr(self) -> str:
        etp = f", etp={list(self.etp.ranks)}" if self.etp is not None else ""
        return (
            f"num_experts={self.num_experts}, local={self.num_local_experts}, ep={list(self.ep.ranks)}{etp}, "
            f"dispatch={self.dispatch}"
        )
