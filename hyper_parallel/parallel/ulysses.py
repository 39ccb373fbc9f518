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
from hyper_parallel.parallel.attention_blocks import attend, checked_inputs
from hyper_parallel.parallel.ring import ring_attention
from hyper_parallel.parallel.sequence_layout import checked_positions, rank_positions, ulysses_ring_positions


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
    positions = _checked(q, k, v, positions, cp)
    dtype = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if cp.size == 1:
        return attend(q, k, v, positions, positions, causal, scale, dtype)
    layout, _ = checked_positions(positions, q.shape[2], cp)
    return _over_heads(q, k, v, cp, lambda *qkv: attend(*qkv, layout, layout, causal, scale, dtype))


def ulysses_ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ulysses: GroupInfo,
    ring: GroupInfo,
    positions: torch.Tensor,
    causal: bool = True,
) -> torch.Tensor:
    """2-D sequence parallelism (VeOmni's ``ulysses`` x ``cp``, USP): attention of this rank's tokens over
    the whole sequence; [batch, heads, s_local, head_dim].

    The sequence is cut into 2 x ring zig-zag chunks over the ``ring`` ranks, and each ring rank's share
    again into ``ulysses`` contiguous slices (``sequence_layout.ulysses_ring_positions``). One all-to-all
    over ``ulysses`` turns this rank's slice with all heads into its ring rank's whole share with
    heads / ulysses heads; ``ring.ring_attention`` then passes those heads' K/V around the ring; a last
    all-to-all turns the output back. Backward mirrors both (the ring's own backward, then the inverse
    all-to-alls). Heads (and K/V heads) must divide by ulysses.
    """
    positions = _checked(q, k, v, positions, ulysses)
    s_local = q.shape[2]
    expected = ulysses_ring_positions(
        s_local * ulysses.size * ring.size, ring.size, ring.index, ulysses.size, ulysses.index
    )
    if not torch.equal(positions, expected.to(positions.device)):
        raise ValueError(
            f"positions of (ring {ring.index}, ulysses {ulysses.index}) must be ulysses_ring_positions("
            f"{s_local * ulysses.size * ring.size}, {ring.size}, {ring.index}, {ulysses.size}, {ulysses.index}); "
            f"got {positions.tolist()}"
        )
    ring_positions = rank_positions(s_local * ulysses.size * ring.size, ring.size, ring.index).to(positions.device)
    if ulysses.size == 1:
        return ring_attention(q, k, v, ring, ring_positions, causal=causal)
    return _over_heads(q, k, v, ulysses, lambda *qkv: ring_attention(*qkv, ring, ring_positions, causal=causal))


def _checked(q, k, v, positions, group: GroupInfo) -> torch.Tensor:
    """``positions`` as int64 on q's device after the shape rules of head resharding over ``group``."""
    positions = checked_inputs(q, k, v, positions)
    if k.shape != v.shape:
        raise ValueError(f"Ulysses sends K and V stacked: they need one shape, got {tuple(k.shape)}, {tuple(v.shape)}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % group.size or kv_heads % group.size:
        raise ValueError(
            f"Ulysses gives each of the {group.name}={group.size} ranks whole heads: query heads ({heads}) and "
            f"key/value heads ({kv_heads}) on this rank must be divisible by {group.name}={group.size}; use a "
            f"{group.name} that divides {math.gcd(heads, kv_heads)}, or K/V all-gather / ring CP"
        )
    return positions


def _over_heads(q, k, v, group: GroupInfo, attention: Callable) -> torch.Tensor:
    """``attention`` (q, k, v) -> out run on head shards: q/k/v from sequence to heads over ``group``
    (stacked in one all-to-all; GQA: q and stacked K/V, two), its output back (one more)."""
    if q.shape[1] == k.shape[1]:
        q_all, k_all, v_all = SequenceToHeads.apply(torch.stack((q, k, v)), group).unbind(0)
    else:
        q_all = SequenceToHeads.apply(q, group)
        k_all, v_all = SequenceToHeads.apply(torch.stack((k, v)), group).unbind(0)
    return HeadsToSequence.apply(attention(q_all, k_all, v_all), group)


def attention_core(cp: GroupInfo) -> Callable:
    """An ``Attention.core`` (q, k, v, positions) -> out for the model in ``hyper_parallel.models.transformer``."""

    def core(q, k, v, positions):
        return ulysses_attention(q, k, v, cp, positions, causal=True)

    return core


def ulysses_ring_core(ulysses: GroupInfo, ring: GroupInfo) -> Callable:
    """An ``Attention.core`` for 2-D sequence parallelism (``ulysses_ring_attention``)."""

    def core(q, k, v, positions):
        return ulysses_ring_attention(q, k, v, ulysses, ring, positions, causal=True)

    return core
