"""Context parallelism (CP): attention over a sequence split across the ranks of the ``cp`` group.

Each rank holds its load-balanced (zig-zag) chunks of the sequence (``sequence_layout``); its queries
need every earlier key and value, wherever it lives. Two ways to bring them:

``impl="all_gather"`` (M5, M6) gathers K and V stacked into ONE all-gather per call (half the latency of
two; the same bytes). Its backward is ONE reduce-scatter: every rank's queries contribute a partial
gradient to every key and value, so the K/V gradients are summed over the cp group and each rank keeps
the part for the tokens it holds. The gathered keys stay in rank order (not global order): softmax over
keys is invariant to their order as long as each key keeps its position, so the mask is built from the
gathered key positions and no reordering copy is needed. Simple, but every rank holds the whole
sequence's K/V and all its scores until backward.

``impl="ring"`` (M5-R) passes K/V blocks around the ring, each transfer overlapping the attention on
the block in hand, and merges the blocks with the online softmax: only two blocks alive at once, and
no scores kept for backward (``ring.py``).

Every collective goes through ``hyper_parallel.comm``, so it appears in traces on the cp group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hyper_parallel.comm import GroupInfo
from hyper_parallel.parallel.attention_blocks import attend, checked_inputs
from hyper_parallel.parallel.autograd_comm import AllGatherWithReduceScatterBackward
from hyper_parallel.parallel.ring import ring_attention
from hyper_parallel.parallel.sequence_layout import checked_positions

IMPLS = ("all_gather", "ring")
"""The K/V exchanges of this module; Ulysses (head resharding by all-to-all) is ``ulysses.py``."""


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
    if impl == "ring":
        return ring_attention(q, k, v, cp, positions, causal=causal, scale=scale)
    positions = checked_inputs(q, k, v, positions)
    dtype = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5 if scale is None else scale  # SDPA's default
    if cp.size == 1:
        return attend(q, k, v, positions, positions, causal, scale, dtype)
    layout, _ = checked_positions(positions, q.shape[2], cp)
    if k.shape == v.shape and k.dtype == v.dtype:  # one collective for both
        # the gathered K/V feed this rank's queries only: each rank's gradient of them is a partial sum,
        # reduce-scattered back in backward
        k_all, v_all = AllGatherWithReduceScatterBackward.apply(torch.stack((k, v)), 3, cp).unbind(0)
    else:  # e.g. a different value head_dim (MLA-like): one each
        k_all, v_all = (
            AllGatherWithReduceScatterBackward.apply(k, 2, cp),
            AllGatherWithReduceScatterBackward.apply(v, 2, cp),
        )
    return attend(q, k_all, v_all, positions, layout, causal, scale, dtype)


def attention_core(cp: GroupInfo, impl: str = "all_gather") -> Callable:
    """An ``Attention.core`` (q, k, v, positions) -> out for the model in ``hyper_parallel.models.transformer``."""

    def core(q, k, v, positions):
        return context_parallel_attention(q, k, v, cp, positions, causal=True, impl=impl)

    return core
