"""Context parallelism (CP): attention over a sequence split across the ranks of the ``cp`` group.

Why a load-balanced split. With a causal mask, query ``p`` attends to keys ``0..p``: a contiguous
split would leave the rank holding the first tokens nearly idle and the last one doing most of the
work. The sequence is cut into ``2*cp`` equal chunks and rank ``i`` holds chunks ``i`` and
``2*cp-1-i`` (one early, one late), so every rank does the same amount of causal work (TorchTitan,
Megatron-LM). Example, S=16, cp=2: rank 0 holds [0..3, 12..15], rank 1 holds [4..11].

Why all-gather K/V. Each rank's queries need every earlier key and value, wherever it lives. The
default implementation gathers K and V stacked into ONE all-gather per call (half the latency of
two; the same bytes). Its backward is ONE reduce-scatter: every rank's queries contribute a partial
gradient to every key and value, so the K/V gradients are summed over the cp group and each rank
keeps the part for the tokens it holds. The gathered keys stay in rank order (not global order):
softmax over keys is invariant to their order as long as each key keeps its position, so the mask
is built from the gathered key positions and no reordering copy is needed. ``impl="ring"`` instead
passes K/V blocks around the ring (cp-1 shifts) with an online (flash-style) softmax; its backward
shifts the gradients the other way. It is a synchronous **emulation** of ring attention: each shift
is one blocking ``all_to_all_single`` with a single non-empty split each way (send my block to the
next rank, receive the previous rank's), so it moves exactly a ring's bytes in a ring's cp-1 steps,
but the transfer of block i+1 does not overlap the attention of block i, and no memory is saved
(autograd keeps every block's K/V and scores for backward, where a production ring recomputes them).
It shows the communication pattern and the online softmax, checked against the same numbers.

Every collective goes through ``hyper_parallel.comm``, so it appears in traces on the cp group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hyper_parallel import comm
from hyper_parallel.comm import GroupInfo
from hyper_parallel.parallel.autograd_comm import AllGatherWithReduceScatterBackward, AllGatherWithSplitBackward

IMPLS = ("all_gather", "ring")
"""The K/V exchanges of this module; Ulysses (head resharding by all-to-all) is ``ulysses.py``."""


def load_balanced_positions(
    seq_len: int, cp_size: int, cp_index: int, device: torch.device | None = None
) -> torch.Tensor:
    """Global positions held by cp rank ``cp_index``, in local order: chunk ``i`` then chunk ``2*cp-1-i``."""
    if cp_size < 1 or not 0 <= cp_index < cp_size:
        raise ValueError(
            f"cp_index must be in [0, cp_size) with cp_size >= 1, got cp_index={cp_index}, cp_size={cp_size}"
        )
    if seq_len < 1 or seq_len % (2 * cp_size):
        raise ValueError(
            f"seq_len={seq_len} must be a positive multiple of 2*cp = {2 * cp_size}: load-balanced context "
            f"parallelism cuts the sequence into 2*cp equal chunks; nearest valid seq_len: "
            f"{max(2 * cp_size, round(seq_len / (2 * cp_size)) * 2 * cp_size)}"
        )
    chunk = seq_len // (2 * cp_size)
    first, second = cp_index, 2 * cp_size - 1 - cp_index
    return torch.cat(
        [
            torch.arange(first * chunk, (first + 1) * chunk, device=device),
            torch.arange(second * chunk, (second + 1) * chunk, device=device),
        ]
    )


def gathered_positions(seq_len: int, cp_size: int, device: torch.device | None = None) -> torch.Tensor:
    """Positions of every rank concatenated in group rank order: the order of an all-gathered sequence
    (also the sequence order Ulysses attends over after its all-to-all)."""
    return torch.cat([load_balanced_positions(seq_len, cp_size, i, device) for i in range(cp_size)])


def checked_positions(positions: torch.Tensor, s_local: int, cp: GroupInfo) -> tuple[torch.Tensor, int]:
    """The gathered sequence's positions and this rank's index, after checking that ``positions`` are
    this rank's load-balanced chunks (the inputs must have been sharded with ``shard_sequence``)."""
    layout = gathered_positions(s_local * cp.size, cp.size, positions.device)
    index = cp_index(cp)
    if not torch.equal(positions, layout[index * s_local : (index + 1) * s_local]):
        raise ValueError(
            f"positions of cp rank {index} must be load_balanced_positions({s_local * cp.size}, {cp.size}, {index}) "
            f"(use shard_sequence on the inputs and on the position ids); got {positions.tolist()}"
        )
    return layout, index


def cp_index(cp: GroupInfo) -> int:
    """This rank's index in the cp group (0 for a group of one, which needs no process group)."""
    return cp.index


def shard_sequence(tensor: torch.Tensor, dim: int, cp: GroupInfo) -> torch.Tensor:
    """This rank's tokens of a full-sequence tensor (inputs, targets, position ids): a local index_select.

    Every rank already has the full tensor (same data loader over dp), so no communication is needed.
    A cp group of one returns ``tensor`` unchanged (and then any length is allowed).
    """
    if cp.size == 1:
        return tensor
    positions = load_balanced_positions(tensor.shape[dim], cp.size, cp_index(cp), tensor.device)
    return tensor.index_select(dim, positions)


def unshard_sequence(tensor: torch.Tensor, dim: int, cp: GroupInfo) -> torch.Tensor:
    """The full sequence in global order from every rank's shard: one all-gather, then a reorder.

    Autograd: the gradient reaching the full tensor is taken to be the same on every rank (a loss
    each rank computes identically on the gathered tensor), so backward keeps this rank's tokens
    without communication. Use it to gather outputs and in tests, not inside a model.
    """
    if cp.size == 1:
        return tensor
    dim = dim % tensor.dim()
    order = torch.argsort(gathered_positions(tensor.shape[dim] * cp.size, cp.size, tensor.device))
    gathered = AllGatherWithSplitBackward.apply(tensor, dim, cp)
    return gathered.index_select(dim, order)


class RingShift(torch.autograd.Function):
    """Forward: send my block to the next cp rank and receive the previous rank's (one all-to-all
    with a single non-empty split each way). Backward: the same shift in the opposite direction."""

    @staticmethod
    def forward(ctx, block: torch.Tensor, info: GroupInfo, step: int) -> torch.Tensor:
        ctx.info, ctx.step = info, step
        return _shift(block, info, step)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _shift(grad, ctx.info, -ctx.step), None, None


def _shift(block: torch.Tensor, info: GroupInfo, step: int) -> torch.Tensor:
    """Rank index ``i`` receives the block of index ``i - step`` (mod size)."""
    index, size = cp_index(info), info.size
    rows = block.shape[0]
    send = [rows if j == (index + step) % size else 0 for j in range(size)]
    recv = [rows if j == (index - step) % size else 0 for j in range(size)]
    out = torch.empty_like(block, memory_format=torch.contiguous_format)
    return comm.all_to_all_single(out, block.contiguous(), info, output_splits=recv, input_splits=send)


def _expand_heads(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: repeat K/V heads after communication (only the few are sent)."""
    hq, hk = q.shape[1], kv.shape[1]
    if hq == hk:
        return kv
    if hq % hk:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")
    return kv.repeat_interleave(hq // hk, dim=1)


def _scores(q, k, q_pos, k_pos, causal, scale, dtype):
    scores = torch.matmul(q.to(dtype), _expand_heads(q, k).to(dtype).transpose(-2, -1)) * scale
    if causal:
        scores = scores.masked_fill(q_pos[:, None] < k_pos[None, :], float("-inf"))
    return scores


def context_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cp: GroupInfo,
    positions: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
    impl: str = "all_gather",
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence; returns [batch, heads, s_local, head_dim].

    ``q``, ``k``, ``v`` are local [batch, heads, s_local, head_dim] (K/V may have fewer heads: GQA)
    for this rank's ``positions`` (``load_balanced_positions``, i.e. what ``shard_sequence`` gives).
    The mask is ``query position >= key position`` on global positions. Scores and softmax run in
    float32 (float64 stays float64); the output has q's dtype. A cp group of one is plain attention
    with no communication.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be [batch, heads, seq, head_dim], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    s_local = q.shape[2]
    if k.shape[2] != s_local or v.shape[2] != s_local or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"q, k, v must hold the same tokens: got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    positions = positions.to(device=q.device, dtype=torch.long)
    if positions.shape != (s_local,):
        raise ValueError(f"positions must be [{s_local}] (one per local token), got shape {tuple(positions.shape)}")
    _expand_heads(q, k[:, :, :0])  # check GQA head counts before any rank enters a collective
    dtype = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5 if scale is None else scale  # SDPA's default
    if cp.size == 1:
        return attend(q, k, v, positions, positions, causal, scale, dtype)
    layout, index = checked_positions(positions, s_local, cp)
    if impl == "ring":
        return _ring_attention(q, k, v, cp, index, positions, layout.view(cp.size, s_local), causal, scale, dtype)
    same = k.shape == v.shape and k.dtype == v.dtype
    if same:  # one collective for both
        # the gathered K/V feed this rank's queries only: each rank's gradient of them is a partial sum,
        # reduce-scattered back in backward
        k_all, v_all = AllGatherWithReduceScatterBackward.apply(torch.stack((k, v)), 3, cp).unbind(0)
    else:  # e.g. a different value head_dim (MLA-like): one each
        k_all, v_all = (
            AllGatherWithReduceScatterBackward.apply(k, 2, cp),
            AllGatherWithReduceScatterBackward.apply(v, 2, cp),
        )
    return attend(q, k_all, v_all, positions, layout, causal, scale, dtype)


def attend(q, k, v, q_pos, k_pos, causal, scale, dtype):
    """Softmax attention of q over k/v at explicit global positions (mask: query pos >= key pos),
    scores in ``dtype``, output in q's dtype. Shared by CP and Ulysses attention."""
    probs = torch.softmax(_scores(q, k, q_pos, k_pos, causal, scale, dtype), dim=-1)
    return torch.matmul(probs, _expand_heads(q, v).to(dtype)).to(q.dtype)


def _ring_attention(q, k, v, cp, index, q_pos, block_pos, causal, scale, dtype):
    """Online softmax over the cp blocks as they pass by: running max ``m``, denominator ``row_sum``,
    numerator ``acc``. Rows a block masks out entirely (max = -inf) contribute nothing. The result
    does not depend on ``m`` mathematically, so ``m`` is detached (exact gradients, no NaN from -inf)."""
    if k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError("impl='ring' needs K and V of the same shape and dtype (they travel stacked)")
    kv = torch.stack((k, v)).movedim(3, 0)  # [s_local, 2, batch, heads, head_dim]: rows to send
    m = torch.full(q.shape[:3] + (1,), float("-inf"), dtype=dtype, device=q.device)
    row_sum = torch.zeros_like(m)
    acc = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=dtype, device=q.device)
    for step in range(cp.size):
        if step:
            kv = RingShift.apply(kv, cp, 1)
        k_blk, v_blk = kv.movedim(0, 3).unbind(0)
        scores = _scores(q, k_blk, q_pos, block_pos[(index - step) % cp.size], causal, scale, dtype)
        m_new = torch.maximum(m, scores.detach().amax(dim=-1, keepdim=True))  # a stabiliser: no gradient
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(scores - m_safe)
        correction = torch.exp(m - m_safe)
        row_sum = row_sum * correction + p.sum(dim=-1, keepdim=True)
        acc = acc * correction + torch.matmul(p, _expand_heads(q, v_blk).to(dtype))
        m = m_new
    return (acc / row_sum).to(q.dtype)


def attention_core(cp: GroupInfo, impl: str = "all_gather") -> Callable:
    """An ``Attention.core`` (q, k, v, positions) -> out for the model in ``hyper_parallel.models.transformer``."""

    def core(q, k, v, positions):
        return context_parallel_attention(q, k, v, cp, positions, causal=True, impl=impl)

    return core
