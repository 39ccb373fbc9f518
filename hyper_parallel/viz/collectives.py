"""Figures of notebook 00b: measured collective times with their alpha-beta fit, and the same model on the
planner's links (``hyper_parallel.cost_model.alpha_beta``). Inputs are plain rows {op, n, bytes, seconds}."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from hyper_parallel.cost_model.alpha_beta import COLLECTIVES, Fit, Link, ring_tree_crossover_bytes
from hyper_parallel.viz.style import fmt_bytes, new_figure, rank_color

_SIZE_TICKS = (1 << 10, 1 << 20, 1 << 30)


def _grid(sizes: Sequence[float], points: int = 40) -> list[float]:
    low, high = min(sizes), max(sizes)
    return [low * (high / low) ** (i / (points - 1)) for i in range(points)]


def collectives_figure(rows: Sequence[Mapping], fits: Mapping[str, Fit]) -> Figure:
    """One panel per collective: measured times (points, one colour per world size) and the fitted
    alpha * hops + wire * bytes / beta (lines) against the full buffer's bytes, log-log."""
    ops = [op for op in COLLECTIVES if op in fits]
    fig = new_figure(3.0 * len(ops), 3.2)
    axes = fig.subplots(1, len(ops), sharey=True, squeeze=False)[0]
    world_sizes = sorted({row["n"] for row in rows})
    for ax, op in zip(axes, ops):
        mine = [row for row in rows if row["op"] == op]
        for n in world_sizes:
            points = sorted((row["bytes"], row["seconds"]) for row in mine if row["n"] == n)
            if not points:
                continue
            color = rank_color(world_sizes.index(n), len(world_sizes) + 1)
            ax.plot([b for b, _ in points], [s * 1e6 for _, s in points], "o", color=color, label=f"{n} ranks")
            grid = _grid([b for b, _ in points])
            ax.plot(grid, [fits[op].seconds(n, b) * 1e6 for b in grid], "-", color=color, alpha=0.8)
        f = fits[op]
        ax.set_title(f"{op}\nα {f.alpha * 1e6:.0f} us, β {f.beta / 1e9:.2f} GB/s", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes (full buffer)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("time (us), fastest of the repeats")
    axes[0].legend(fontsize=8)
    fig.suptitle("Collectives on this machine (gloo, loopback): measured (points) and the α-β fit (lines)")
    return fig


def links_figure(places: Sequence[tuple[Link, int]], ring_tree: tuple[Link, int]) -> Figure:
    """Left: a ring all-reduce's modelled time against its size on each (link, ranks). Right: ring and tree
    all-reduce on one of them, and the size where they cost the same."""
    fig = new_figure(10.0, 3.6)
    left, right = fig.subplots(1, 2)
    sizes = _grid([1 << 10, 1 << 30], 60)
    for index, (link, n) in enumerate(places):
        times = [link.seconds("all_reduce", n, b) for b in sizes]
        left.plot(sizes, times, color=rank_color(index, len(places) + 1), label=f"{link.name}, {n} ranks")
    left.set_title("ring all-reduce, α-β model", fontsize=10)
    left.set_ylabel("seconds")
    link, n = ring_tree
    for algorithm, style in (("ring", "-"), ("tree", "--")):
        right.plot(sizes, [link.seconds("all_reduce", n, b, algorithm) for b in sizes], style, label=algorithm)
    crossover = ring_tree_crossover_bytes(n, link.alpha, link.beta)
    right.axvline(crossover, color="grey", linestyle=":", label=f"equal at {fmt_bytes(crossover)}")
    right.set_title(f"ring vs tree all-reduce, {n} ranks\n{link.name}", fontsize=10)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(_SIZE_TICKS, [fmt_bytes(t) for t in _SIZE_TICKS])
        ax.set_xlabel("bytes (full buffer)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return fig
