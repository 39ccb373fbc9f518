"""Notebook 04's lessons on the ring and on 2-D sequence parallelism: the online-softmax merge on a toy row,
the work each rank's ring steps do, and which rank holds which tokens and heads.

The numbers come from the library itself (``parallel.attention_blocks``, ``parallel.ring``,
``parallel.sequence_layout``); the figures from ``hyper_parallel.viz.sequence``.
"""

from __future__ import annotations

import torch

from hyper_parallel.comm import GroupInfo
from hyper_parallel.parallel.attention_blocks import block_attention, merge_partial
from hyper_parallel.parallel.ring import RingPlan
from hyper_parallel.parallel.sequence_layout import gathered_positions, load_balanced_positions, ulysses_ring_positions


def online_softmax_steps(scores: list[float], block: int) -> list[dict]:
    """The ring's merge on one row of scores, ``block`` keys at a time: after each block, the running max m,
    the running sum l = sum exp(s - m) of the keys seen, lse = m + log l, and the probabilities so far.

    It runs the ring's own ``block_attention`` and ``merge_partial`` with one query whose score against key
    j is ``scores[j]`` (q = 1, k_j = s_j, head_dim 1, scale 1) and value one-hot e_j: the output is the
    softmax probabilities themselves."""
    row = torch.tensor(scores, dtype=torch.float64)
    n = len(scores)
    q, k, v = torch.ones(1, 1, 1, 1, dtype=row.dtype), row.view(1, 1, n, 1), torch.eye(n, dtype=row.dtype)[None, None]
    out, lse = torch.zeros(1, 1, 1, n, dtype=row.dtype), torch.full((1, 1, 1), float("-inf"), dtype=row.dtype)
    positions, steps = torch.arange(n), []
    for start in range(0, n, block):
        keys = slice(start, min(start + block, n))
        part = block_attention(q, k[:, :, keys], v[:, :, keys], positions[:1], positions[keys], False, 1.0, row.dtype)
        out, lse = merge_partial(out, lse, *part)
        m = float(row[: keys.stop].max())
        steps.append(
            {
                "keys": (keys.start, keys.stop),
                "max": m,
                "sum": float(torch.exp(lse.view(()) - m)),
                "lse": float(lse.view(())),
                "probabilities": out.view(-1).tolist(),
            }
        )
    return steps


def two_d_holdings(seq_len: int, ring: int, ulysses: int, heads: int) -> list[dict]:
    """For each rank of a ring x ulysses mesh (ulysses inner, as ``ParallelDims.views``): its ring and
    ulysses index, the tokens it holds outside attention (all heads) and, inside attention after the
    all-to-all, its ring rank's whole share for ``heads / ulysses`` heads."""
    holdings = []
    for r in range(ring):
        share = load_balanced_positions(seq_len, ring, r).tolist()
        for u in range(ulysses):
            per = heads // ulysses
            holdings.append(
                {
                    "rank": r * ulysses + u,
                    "ring": r,
                    "ulysses": u,
                    "tokens": ulysses_ring_positions(seq_len, ring, r, ulysses, u).tolist(),
                    "attention_tokens": share,
                    "attention_heads": list(range(u * per, (u + 1) * per)),
                }
            )
    return holdings


def pairs_computed(seq_len: int, cp: int, index: int, zigzag: bool = True) -> list[int]:
    """The (query chunk, key chunk) pairs cp rank ``index`` computes at each step of a causal ring forward
    (``RingPlan.pairs``, decided from the positions): exercise 04.2's answer."""
    positions = gathered_positions(seq_len, cp, zigzag).view(cp, -1)
    plan = RingPlan(
        GroupInfo("cp", tuple(range(cp)), None), index, positions, 2 if zigzag else 1, True, 1.0, torch.float32
    )
    return [len(plan.pairs(plan.block_at(step))) for step in range(cp)]
