"""Ulysses sequence parallelism (DeepSpeed-Ulysses, VeOmni's ``ulysses`` dim) over the ``cp`` ranks.

Why a third sequence scheme. CP (``cp.py``) keeps every head on every rank and moves keys and values:
an all-gather of K/V (or cp-1 ring shifts), whose bytes per rank do not shrink as cp grows. Ulysses
moves the *layout* instead: outside attention the sequence is sharded over cp exactly as in CP; right
before attention one all-to-all turns "my tokens, all my heads" into "all tokens, heads/cp of my heads",
each rank then runs ordinary attention over the whole sequence for its heads, and the inverse
all-to-all turns the output back into sequence shards. Each rank sends (cp-1)/cp of four activations
of its own tokens (q, k, v, out) per direction: per rank that falls as 1/cp, while K/V all-gather
stays near the size of K and V of the whole sequence. The prices: whole heads per rank, so ``n_heads``
(per tp rank) must split over cp, ``n_heads % (tp * cp) == 0`` (``ParallelDims.check_model``): cp is
capped by the head count; under GQA the few K/V heads must split over cp as well; and an all-to-all
needs every cp rank to reach every other at full speed (a uniform fabric, in practice inside a node),
where a ring needs only neighbours. Score memory is not one of them: (heads/cp) x S x S per rank is
what K/V all-gather holds too, heads x (S/cp) x S.

Why CP's load-balanced chunks. Ulysses does not need them (every rank attends over the whole
sequence), but keeping CP's token layout (rank i holds chunks i and 2cp-1-i) means the data loading,
rotary positions and loss of a recipe are the same code as CP's, and the losses of the three schemes
can be compared number for number. The gathered sequence is in rank order, not global order; the
causal mask is built from the gathered positions, so no reordering copy is needed (as in cp.py).

Backward mirrors forward: the adjoint of an all-to-all that permutes blocks is the inverse
permutation, so ``SequenceToHeads`` backward is the heads-to-sequence all-to-all and vice versa. Both
go through ``hyper_parallel.comm``, so traces record them on the cp group with their bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from hyper_parallel import comm
from hyper_parallel.comm import GroupInfo
from hyper_parallel.parallel.attention_blocks import attend
from hyper_parallel.parallel.sequence_layout import checked_positions


def _all_to_all(send: torch.Tensor, info: GroupInfo) -> torch.Tensor:
    """Block j of dim 0 goes to group rank j; block j of the result came from group rank j."""
    out = torch.empty_like(send)
    return comm.all_to_all_single(out, send, info)


def sequence_to_heads(x: torch.Tensor, info: GroupInfo) -> torch.Tensor:
    """[..., heads, s_local, d] of this rank's tokens -> [..., heads/cp, cp*s_local, d] of every rank's
    tokens (rank order) for this rank's group of heads. One all-to-all, no autograd."""
    *lead, heads, s_local, d = x.shape
    size = info.size
    send = x.reshape(-1, size, heads // size, s_local, d).movedim(1, 0).contiguous()  # [cp, L, h, s, d]
    recv = _all_to_all(send, info)
    return recv.permute(1, 2, 0, 3, 4).reshape(*lead, heads // size, size * s_local, d)


def heads_to_sequence(y: torch.Tensor, info: GroupInfo) -> torch.Tensor:
    """The inverse of ``sequence_to_heads``: [..., h, cp*s_local, d] -> [..., cp*h, s_local, d]."""
    *lead, heads, seq, d = y.shape
    size = info.size
    send = y.reshape(-1, heads, size, seq // size, d).permute(2, 0, 1, 3, 4).contiguous()  # [cp, L, h, s, d]
    recv = _all_to_all(send, info)
    return recv.movedim(0, 1).reshape(*lead, size * heads, seq // size, d)


class SequenceToHeads(torch.autograd.Function):
    """Forward: sequence shards -> head shards (one all-to-all). Backward: the inverse all-to-all."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, info: GroupInfo) -> torch.Tensor:
        ctx.info = info
        return sequence_to_heads(x, info)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return heads_to_sequence(grad, ctx.info), None


class HeadsToSequence(torch.autograd.Function):
    """Forward: head shards -> sequence shards (one all-to-all). Backward: the inverse all-to-all."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, info: GroupInfo) -> torch.Tensor:
        ctx.info = info
        return heads_to_sequence(y, info)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return sequence_to_heads(grad, ctx.info), None


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cp: GroupInfo,
    positions: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of this rank's tokens over the whole sequence by head resharding; [batch, heads, s_local, d].

    Same contract as ``cp.context_parallel_attention``: local q, k, v [batch, heads, s_local, head_dim]
    at this rank's load-balanced ``positions``. Heads (and K/V heads, for GQA) must divide by cp. When
    q, k and v have the same shape they travel stacked in ONE all-to-all (GQA: two, q and stacked K/V);
    the output takes one more. A cp group of one is plain attention with no communication.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be [batch, heads, seq, head_dim], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    s_local = q.shape[2]
    if k.shape != v.shape or k.shape[2] != s_local or k.shape[0] != q.shape[0]:
        raise ValueError(
            f"q, k, v must hold the same tokens and K, V one shape: got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    positions = positions.to(device=q.device, dtype=torch.long)
    if positions.shape != (s_local,):
        raise ValueError(f"positions must be [{s_local}] (one per local token), got shape {tuple(positions.shape)}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    if heads % cp.size or kv_heads % cp.size:
        raise ValueError(
            f"Ulysses gives each of the cp={cp.size} ranks whole heads: query heads ({heads}) and "
            f"key/value heads ({kv_heads}) on this rank must be divisible by cp={cp.size}; use a cp that divides "
            f"{math.gcd(heads, kv_heads)}, or K/V all-gather / ring CP"
        )
    dtype = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if cp.size == 1:
        return attend(q, k, v, positions, positions, causal, scale, dtype)
    layout, index = checked_positions(positions, s_local, cp)
    if heads == kv_heads:
        q_all, k_all, v_all = SequenceToHeads.apply(torch.stack((q, k, v)), cp).unbind(0)
    else:
        q_all = SequenceToHeads.apply(q, cp)
        k_all, v_all = SequenceToHeads.apply(torch.stack((k, v)), cp).unbind(0)
    out = attend(q_all, k_all, v_all, layout, layout, causal, scale, dtype)
    return HeadsToSequence.apply(out, cp)


def attention_core(cp: GroupInfo) -> Callable:
    """An ``Attention.core`` (q, k, v, positions) -> out for the model in ``hyper_parallel.models.transformer``."""

    def core(q, k, v, positions):
        return ulysses_attention(q, k, v, cp, positions, causal=True)

    return core
