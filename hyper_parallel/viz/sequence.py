"""Figures of the ring and of 2-D sequence parallelism for notebook 04 (their numbers: launch/notebook/sequence_lesson).

online_softmax(scores, steps)         a toy row of scores merged block by block: the running max m and
                                      sum l after each block, and the probabilities converging to softmax
two_d_layout(holdings, seq_len, heads) which rank holds which tokens outside attention, and which tokens
                                      and heads inside it after the Ulysses all-to-all
ring_work(work)                       the attention FLOPs of each cp rank, zig-zag against contiguous
"""

from __future__ import annotations

import math

import matplotlib
from matplotlib.figure import Figure

from hyper_parallel.viz.style import new_figure, rank_color


def online_softmax(scores: list[float], steps: list[dict]) -> Figure:
    """Left: the scores, one colour per block, with the running max m after each block; right: the
    probabilities after each block (faint to solid) against ``softmax(scores)`` (black rings)."""
    fig = new_figure(11, 3.6)
    ax, pax = fig.subplots(1, 2)
    palette = matplotlib.colormaps["tab10"]
    for i, step in enumerate(steps):
        start, stop = step["keys"]
        ax.bar(range(start, stop), scores[start:stop], color=palette(i), label=f"block {i}: keys {start}-{stop - 1}")
        ax.hlines(step["max"], start - 0.4, stop - 0.6, color="black", linewidth=2)
        ax.text(
            (start + stop - 1) / 2,
            step["max"] + 0.1,
            f"m={step['max']:.2f}\nl={step['sum']:.3f}",
            fontsize=8,
            ha="center",
            va="bottom",
        )
    top, bottom = max(scores), min(0.0, min(scores))
    ax.set_ylim(bottom - 0.1 * (top - bottom), top + 0.45 * (top - bottom))
    ax.set_xlabel("key j")
    ax.set_ylabel("score s_j")
    ax.set_title("blocks arrive one by one: running max m, running sum l = Σ exp(s - m)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    exact = [math.exp(s - steps[-1]["lse"]) for s in scores]
    for i, step in enumerate(steps):
        alpha = 0.25 + 0.75 * (i + 1) / len(steps)
        pax.plot(step["probabilities"], marker="o", color=palette(i), alpha=alpha, label=f"after block {i}")
    pax.plot(exact, linestyle="none", marker="o", markersize=11, markerfacecolor="none", color="black", label="softmax")
    pax.set_xlabel("key j")
    pax.set_ylabel("probability")
    pax.set_title("merged output: exp(s - lse) with lse = m + log l, rescaled at each block", fontsize=9)
    pax.legend(fontsize=7)
    return fig


def two_d_layout(holdings: list[dict], seq_len: int, heads: int) -> Figure:
    """One row per rank: left, the tokens it holds outside attention (every head); right, the tokens and
    heads it attends with after the Ulysses all-to-all (its ring rank's whole share, heads/ulysses heads)."""
    fig = new_figure(12, 0.55 * len(holdings) + 1.8)
    ax, hax = fig.subplots(1, 2)
    world = len(holdings)
    for row, holding in enumerate(holdings):
        color = rank_color(holding["rank"], world)
        for token in holding["tokens"]:
            ax.barh(row, 1, left=token, color=color, edgecolor="white")
        for token in holding["attention_tokens"]:
            hax.barh(row, 1, left=token, color=color, alpha=0.55, edgecolor="white")
        hax.text(seq_len + 0.3, row, f"heads {holding['attention_heads']}", va="center", fontsize=8)
    labels = [f"rank {h['rank']} (ring {h['ring']}, ulysses {h['ulysses']})" for h in holdings]
    for axis, title in (
        (ax, f"outside attention: tokens held, all {heads} heads"),
        (hax, "inside attention, after the Ulysses all-to-all: tokens x heads"),
    ):
        axis.set_yticks(range(world), labels, fontsize=8)
        axis.invert_yaxis()
        axis.set_xlim(0, seq_len + (4 if axis is hax else 0))
        axis.set_xticks(range(0, seq_len + 1, max(1, seq_len // 8)))
        axis.set_xlabel("token position")
        axis.set_title(title, fontsize=9)
    return fig


def ring_work(work: dict[str, list[int]]) -> Figure:
    """Per-rank attention FLOPs of one causal ring attention (forward and backward), one bar group per
    layout (``work``: layout name -> FLOPs by rank)."""
    fig = new_figure(7, 3.2)
    ax = fig.add_subplot()
    layouts = list(work)
    ranks = len(next(iter(work.values())))
    width = 0.8 / len(layouts)
    for i, layout in enumerate(layouts):
        xs = [r + (i - (len(layouts) - 1) / 2) * width for r in range(ranks)]
        ax.bar(xs, work[layout], width, label=layout, gid=layout)
    ax.set_xticks(range(ranks), [f"cp rank {r}" for r in range(ranks)])
    ax.set_ylabel("matmul FLOPs (forward + backward)")
    ax.set_title("causal attention work per rank: the ring's blocks, measured", fontsize=9)
    ax.legend(fontsize=8)
    return fig
