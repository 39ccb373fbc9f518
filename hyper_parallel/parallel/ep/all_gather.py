"""The all-gather token dispatcher for expert parallelism (``parallelize_moe(..., dispatch="all_gather")``).

Megatron-LM's "allgather token dispatcher": instead of sending each routed row only to the ep rank that
owns its expert (``hyper_parallel.parallel.ep.all_to_all``), every rank of the ep group gets ALL the
routed rows of the group, runs its local experts on the rows routed to them and writes zeros for the
rest; a reduce-scatter then sums the (disjoint) contributions and hands every source rank its rows:

    routed [N_i, d] sorted by expert, counts [E]          (N_i may differ between the ranks)
      -> all_gather(counts) over ep               [ep, E]: what every rank routes to every expert;
                                                  capacity C = max_j N_j (the padded row count)
      -> pad routed to [C, d] with zero rows
      -> AllGatherWithReduceScatterBackward along rows: all_gather over ep -> [ep * C, d]   (backward: reduce_scatter)
      -> select the rows of this rank's experts, expert-major (source rank order inside an expert,
         each source's row order kept: the same rows in the same order as the all-to-all path)
      [-> AllReduceBackward over etp         forward identity, backward all-reduce of the input grad]
      -> local experts on ``to_local()`` weights (ETP: w1 colwise / w2 rowwise hidden shard)
      [-> AllReduceForward over etp          forward all-reduce of the partial outputs, backward identity]
      -> scatter the outputs into zeros [ep * C, d] at the selected positions
      -> ReduceScatterWithAllGatherBackward along rows: reduce_scatter over ep -> [C, d]   (backward: all_gather)
      -> drop the padding: [N_i, d], rows in the caller's order

Every row is computed by exactly one rank of the ep group (its expert's owner) and the others add
exact zeros, so outputs and gradients equal the all-to-all path's up to float reordering (in practice
bit for bit). Parameters are the ``ExpertParallelExperts`` ones (same names, layouts and DTensor
placements): this class only replaces ``forward``.

Collectives per MoE layer (ep group; a group of size 1 records nothing):

    forward    1 all_gather (counts, int64, ep x E)  + 1 all_gather (rows, ep x C x d)
               + 1 reduce_scatter (outputs, ep x C x d)       [+ 1 all_reduce on etp]
    backward   1 all_gather (the output gradient, adjoint of the reduce_scatter)
               + 1 reduce_scatter (the input gradient, adjoint of the dispatch all_gather)
               [+ 1 all_reduce on etp]

Trade-off against all-to-all: every rank receives (and the reduce-scatter moves) the rows of the whole
ep group, ep times the routed volume instead of about 1x, and padding to C costs extra with uneven
token counts; in exchange the collectives have fixed, even splits (no per-destination split sizes)
and gather/reduce-scatter are the best-tuned collectives. Worth it for small ep groups (Megatron's
default for ep * tp small) or tiny token counts; not at scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyper_parallel import comm
from hyper_parallel.comm import GroupInfo
from hyper_parallel.models.moe import grouped_mlp
from hyper_parallel.parallel.autograd_comm import (
    AllGatherWithReduceScatterBackward,
    AllReduceBackward,
    AllReduceForward,
    ReduceScatterWithAllGatherBackward,
)
from hyper_parallel.parallel.ep.all_to_all import ExpertParallelExperts, local_tensor


def gather_counts(counts: torch.Tensor, ep: GroupInfo) -> torch.Tensor:
    """``counts [E]`` (rows this rank routes per global expert) -> ``[ep, E]``, row j from rank j of the
    group. One all_gather (no autograd)."""
    gathered = counts.new_empty(ep.size * counts.numel())
    comm.all_gather_into_tensor(gathered, counts.contiguous(), ep)
    return gathered.view(ep.size, -1)


def local_rows(all_counts: torch.Tensor, first: int, local: int, capacity: int) -> torch.Tensor:
    """Positions, in the gathered ``[ep * capacity, d]`` buffer, of the rows routed to experts
    ``[first, first + local)``: expert-major, source rank order inside an expert, each source's rows in
    order (source j's rows start at ``j * capacity`` and are sorted by global expert)."""
    sources = all_counts.shape[0]
    starts = torch.cumsum(all_counts, dim=1) - all_counts  # [ep, E] exclusive
    starts = starts + torch.arange(sources, device=all_counts.device).unsqueeze(1) * capacity
    seg_starts = starts[:, first : first + local].t().reshape(-1)  # (expert, source)
    seg_counts = all_counts[:, first : first + local].t().reshape(-1)
    seg_offsets = torch.cumsum(seg_counts, 0) - seg_counts  # within the output
    total = int(seg_counts.sum())
    within = torch.arange(total, device=all_counts.device) - torch.repeat_interleave(seg_offsets, seg_counts)
    return torch.repeat_interleave(seg_starts, seg_counts) + within


class AllGatherExpertParallelExperts(ExpertParallelExperts):
    """``ExpertParallelExperts`` with the all-gather / reduce-scatter token exchange (module docstring)."""

    dispatch = "all_gather"

    def forward(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ep, local = self.ep, self.num_local_experts
        all_counts = gather_counts(counts, ep)  # [ep, E]
        capacity = int(all_counts.sum(1).max())  # host sync (as .tolist())
        first = ep.index * local
        num_rows = routed.shape[0]
        padded = F.pad(routed, (0, 0, 0, capacity - num_rows))  # [C, d]
        # each rank computes only its experts' rows of the gathered ones: its gradient of them is partial
        gathered = AllGatherWithReduceScatterBackward.apply(padded, 0, ep)  # [ep * C, d]
        index = local_rows(all_counts, first, local, capacity)
        rows = gathered[index]
        if self.etp is not None:
            rows = AllReduceBackward.apply(rows, self.etp)
        local_counts = all_counts[:, first : first + local].sum(0).tolist()
        out = grouped_mlp(rows, local_counts, local_tensor(self.w1), local_tensor(self.w2))
        if self.etp is not None:
            out = AllReduceForward.apply(out, self.etp)
        full = out.new_zeros((ep.size * capacity,) + tuple(out.shape[1:])).index_copy(0, index, out)
        return ReduceScatterWithAllGatherBackward.apply(full, 0, ep)[:num_rows]  # [N_i, d]
