"""Ring attention over the cp ranks: K/V blocks travel around the ring while each rank attends to the
block in hand (ring-flash-attention, torch's ``_templated_ring_attention``, picotron's ring attention).

Forward, on cp ranks in a ring (rank index ``i`` sends to ``i+1`` and receives from ``i-1``). At step
``s = 0 .. cp-1`` rank ``i`` holds the K/V block of rank ``i - s``. It first posts the exchange that
brings the next block (an asynchronous isend of the block in hand and irecv of the next, one batch of
P2P ops, ``comm.ring_exchange``), then attends its queries to the block in hand, and only then waits:
the transfer of block ``s+1`` runs under the attention of block ``s``. Each block's result is folded
into the running output with the log-sum-exp merge (``attention_blocks.merge_partial``), so after the
last block the output is exactly softmax attention over the whole sequence.

Memory. Only two K/V blocks are alive at once (the one in hand, the one arriving), and nothing of a
block's scores is kept: autograd saves q, the local k and v, the last block received, the output and one
log-sum-exp per query row. CP's all-gather keeps the whole sequence's K/V and every score (``cp.py``).

Backward retraces the ring in reverse. The block held last in forward (rank ``i+1``'s) is where it
starts; at each step the rank recomputes the block's probabilities from the saved log-sum-exp, adds its
query gradient, and passes the block *and the running dK/dV of that block* to rank ``i-1``, the other
way round the ring. A block's gradient accumulator thus visits every rank that attended to it and ends
at its owner at the last step (no extra hop); the owner's own K/V never travel back (they are saved),
so backward sends cp-2 K/V blocks and cp-1 gradient blocks, each posted before the compute it overlaps.

Causal work under zig-zag (``sequence_layout``). Each rank's tokens are 2 chunks, so a block is a
2 x 2 grid of (query chunk, key chunk) pairs; a pair is skipped when the mask hides all of it,
computed whole when it hides none, masked otherwise (``RingPlan.pairs``, decided from the positions).
Rank ``i`` on its own block computes 3 of the 4 pairs (two masked), and on any other block exactly 2
whole pairs: every rank does the same work. With contiguous blocks (``zigzag=False``) rank ``i`` skips
every later rank's block and computes every earlier one whole: rank cp-1 does cp times rank 0's work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyper_parallel import comm, trace
from hyper_parallel.comm import GroupInfo
from hyper_parallel.parallel.attention_blocks import (
    attend,
    block_attention,
    block_attention_backward,
    checked_inputs,
    merge_partial,
)
from hyper_parallel.parallel.sequence_layout import checked_positions

KV_TAG, GRAD_TAG = 0, 1
"""P2P tags: backward keeps a K/V exchange and a gradient exchange in flight between the same ranks."""


@dataclass(frozen=True)
class BlockPair:
    """One (query chunk, key chunk) of a block: rows ``queries`` of this rank, rows ``keys`` of the block."""

    queries: slice
    keys: slice
    masked: bool  # the causal mask cuts through the pair (False: every key visible to every query)


@dataclass(frozen=True)
class RingPlan:
    """What a rank computes at each step of the ring: its group, every rank's positions, the layout."""

    cp: GroupInfo
    index: int  # this rank's index in the cp group
    positions: torch.Tensor  # [cp, s_local]: the global positions of every rank's tokens, by group index
    chunks: int  # chunks per rank: 2 for zig-zag, 1 for contiguous blocks
    causal: bool
    scale: float
    dtype: torch.dtype  # scores, running output and gradients: float32 (float64 for float64 inputs)

    def block_at(self, step: int) -> int:
        """The group index whose K/V block this rank holds at ``step``."""
        return (self.index - step) % self.cp.size

    def span(self, phase: str, step: int, block: int):
        """The trace event of one step's compute: ``{"kind": "ring", "phase", "ring_step", "block", "pairs"}``
        with its start and end, so a trace shows each block's attention between its exchange's issue and wait."""
        return trace.span("ring", phase=phase, ring_step=step, block=block, pairs=len(self.pairs(block)))

    def pairs(self, block: int) -> list[BlockPair]:
        """The pairs of this rank's queries and ``block``'s keys that are computed (fully masked: left out)."""
        s_local = self.positions.shape[1]
        if not self.causal:
            return [BlockPair(slice(0, s_local), slice(0, s_local), False)]
        size = s_local // self.chunks
        chunks = [slice(c * size, (c + 1) * size) for c in range(self.chunks)]
        q_pos, k_pos = self.positions[self.index].tolist(), self.positions[block].tolist()
        result = []
        for queries in chunks:
            for keys in chunks:
                q, k = q_pos[queries], k_pos[keys]
                if max(q) < min(k):
                    continue  # every query precedes every key
                result.append(BlockPair(queries, keys, masked=min(q) < max(k)))
        return result


class RingAttention(torch.autograd.Function):
    """Forward: K/V around the cp ring (index -> index+1), each block's attention overlapping the next
    block's transfer, merged by log-sum-exp. Backward: the ring retraced (index -> index-1), each block's
    dK/dV travelling with it and arriving at its owner (module docstring)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: RingPlan) -> torch.Tensor:
        kv = torch.stack((k, v))  # [2, batch, kv_heads, s_local, head_dim]: one message per step
        out = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=plan.dtype, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=plan.dtype, device=q.device)
        for step in range(plan.cp.size):
            arriving = torch.empty_like(kv) if step < plan.cp.size - 1 else None
            pending = comm.ring_exchange(kv, arriving, plan.cp, +1, tag=KV_TAG) if arriving is not None else None
            block = plan.block_at(step)
            with plan.span("forward", step, block):
                _forward_block(q, kv, block, plan, out, lse)
            if pending is not None:
                pending.wait()
                kv = arriving
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, kv, out, lse)  # kv: the last block received, rank index+1's
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        plan: RingPlan = ctx.plan
        q, k, v, kv, out, lse = ctx.saved_tensors
        delta = (dout.to(plan.dtype) * out).sum(dim=-1)
        dq = torch.zeros_like(q, dtype=plan.dtype)
        carried = pending_grads = None
        for step in reversed(range(plan.cp.size)):
            arriving = torch.empty_like(kv) if step > 1 else None  # step 1 is followed by this rank's own block
            pending_kv = comm.ring_exchange(kv, arriving, plan.cp, -1, tag=KV_TAG) if arriving is not None else None
            block = plan.block_at(step)
            grads = torch.zeros(kv.shape, dtype=plan.dtype, device=kv.device)  # this rank's share of dK, dV
            with plan.span("backward", step, block):
                _backward_block(q, kv, dout, delta, lse, block, plan, dq, grads)
            if pending_grads is not None:  # what the ranks before this one added to this block's gradient
                pending_grads.wait()
                grads += carried
            if step > 0:
                carried = torch.empty_like(grads)
                pending_grads = comm.ring_exchange(grads, carried, plan.cp, -1, tag=GRAD_TAG)
            if pending_kv is not None:
                pending_kv.wait()
                kv = arriving
            elif step == 1:
                kv = torch.stack((k, v))
        dk, dv = grads.unbind(0)  # the last block was this rank's own: its gradient is complete
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def _forward_block(q, kv, block: int, plan: RingPlan, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Fold this rank's attention to ``block``'s K/V (``kv``) into the running ``out`` and ``lse``, in place."""
    q_pos, k_pos = plan.positions[plan.index], plan.positions[block]
    for pair in plan.pairs(block):
        rows = (slice(None), slice(None), pair.queries)
        block_out, block_lse = block_attention(
            q[rows],
            kv[0][:, :, pair.keys],
            kv[1][:, :, pair.keys],
            q_pos[pair.queries],
            k_pos[pair.keys],
            pair.masked,
            plan.scale,
            plan.dtype,
        )
        out[rows], lse[rows] = merge_partial(out[rows], lse[rows], block_out, block_lse)


def _backward_block(q, kv, dout, delta, lse, block: int, plan: RingPlan, dq: torch.Tensor, grads: torch.Tensor):
    """Add this rank's gradients through ``block``: to its queries' ``dq`` and to the block's ``grads``
    (stacked dK, dV), in place."""
    q_pos, k_pos = plan.positions[plan.index], plan.positions[block]
    for pair in plan.pairs(block):
        rows = (slice(None), slice(None), pair.queries)
        block_dq, block_dk, block_dv = block_attention_backward(
            q[rows],
            kv[0][:, :, pair.keys],
            kv[1][:, :, pair.keys],
            dout[rows],
            delta[rows],
            lse[rows],
            q_pos[pair.queries],
            k_pos[pair.keys],
            pair.masked,
            plan.scale,
            plan.dtype,
        )
        dq[rows] += block_dq
        grads[0][:, :, pair.keys] += block_dk
        grads[1][:, :, pair.keys] += block_dv


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cp: GroupInfo,
    positions: torch.Tensor,
    *,
    zigzag: bool = True,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence, K/V passed around the cp ring;
    [batch, heads, s_local, head_dim] in q's dtype.

    ``q``, ``k``, ``v``: this rank's tokens [batch, heads, s_local, head_dim] (K/V may have fewer heads:
    GQA; they travel stacked, so they need one shape) at ``positions``, this rank's chunks of the
    zig-zag layout (``zigzag=False``: of contiguous blocks; ``sequence_layout.shard_sequence``). A cp
    group of one is plain attention with no communication.
    """
    positions = checked_inputs(q, k, v, positions)
    if k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError(
            f"ring attention sends K and V stacked in one message: they need one shape and dtype, got "
            f"{tuple(k.shape)} {k.dtype} and {tuple(v.shape)} {v.dtype}"
        )
    dtype = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5 if scale is None else scale  # SDPA's default
    if cp.size == 1:
        return attend(q, k, v, positions, positions, causal, scale, dtype)
    s_local = q.shape[2]
    layout, index = checked_positions(positions, s_local, cp, zigzag)
    plan = RingPlan(cp, index, layout.view(cp.size, s_local), 2 if zigzag else 1, causal, scale, dtype)
    return RingAttention.apply(q, k, v, plan)


def work_per_rank(seq_len: int, cp_size: int, zigzag: bool = True, head_dim: int = 8) -> list[int]:
    """Matmul FLOPs each cp rank runs in one causal ring attention (forward and backward, one head, one
    row), measured by torch's ``FlopCounterMode`` over the ring's own block kernels on random data: every
    rank's steps replayed in this process, without communication (what a rank computes does not depend
    on what the others send, only on the positions)."""
    from torch.utils.flop_counter import FlopCounterMode

    from hyper_parallel.parallel.sequence_layout import gathered_positions

    group = GroupInfo("cp", tuple(range(cp_size)), None)
    s_local = seq_len // cp_size
    positions = gathered_positions(seq_len, cp_size, zigzag).view(cp_size, s_local)
    q, kv, dout = (
        torch.randn(1, 1, s_local, head_dim),
        torch.randn(2, 1, 1, s_local, head_dim),
        torch.randn(1, 1, s_local, head_dim),
    )
    work = []
    for index in range(cp_size):
        plan = RingPlan(group, index, positions, 2 if zigzag else 1, True, head_dim**-0.5, torch.float32)
        out, lse = torch.zeros_like(q), torch.full(q.shape[:3], float("-inf"))
        with FlopCounterMode(display=False) as flops:
            for step in range(cp_size):
                _forward_block(q, kv, plan.block_at(step), plan, out, lse)
            delta = (dout * out).sum(dim=-1)
            for step in range(cp_size):
                _backward_block(
                    q, kv, dout, delta, lse, plan.block_at(step), plan, torch.zeros_like(q), torch.zeros_like(kv)
                )
        work.append(flops.get_total_flops())
    return work
