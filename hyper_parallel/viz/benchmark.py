"""Figures of ``python -m launch bench``: the ratios ours / torch FSDP2, and both timelines of a step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from hyper_parallel.run_files import load_traces
from hyper_parallel.viz.style import new_figure
from hyper_parallel.viz.timeline import step_span, timeline

IMPLEMENTATION_NAMES = {"ours": "our fully_shard", "torch": "torch FSDP2 fully_shard"}


def ratio_figure(rows: list[dict[str, Any]], world_size: int | None = None) -> Figure:
    """Per configuration: the median of the pairwise step-time ratios ours / torch with their quartiles
    (whole step and forward + backward), and peak memory per rank of each implementation."""
    fig = new_figure(11, 3.6)
    ax_time, ax_memory = fig.subplots(1, 2, width_ratios=(3, 2))
    names = [row["config"] for row in rows]
    width = 0.38
    for offset, key, label, color in (
        (-width / 2, "ratio", "whole step", "#4c72b0"),
        (width / 2, "forward_backward_ratio", "forward + backward", "#55a868"),
    ):
        medians = [row[key]["median"] for row in rows]
        low = [row[key]["median"] - row[key]["q1"] for row in rows]
        high = [row[key]["q3"] - row[key]["median"] for row in rows]
        xs = [i + offset for i in range(len(rows))]
        bars = ax_time.bar(xs, medians, width, yerr=[low, high], capsize=3, color=color, label=label, gid=key)
        for bar, value in zip(bars, medians):
            ax_time.text(
                bar.get_x() + bar.get_width() / 2,
                0.02,
                f"{value:.2f}",
                ha="center",
                va="bottom",
                fontsize=8,
                color="white",
                fontweight="bold",
            )
    ax_time.axhline(1.0, color="black", linewidth=1.0, linestyle="--")
    ax_time.set_xticks(range(len(rows)), names)
    ax_time.set_ylabel("time ours / torch FSDP2 (median of pairs)")
    highest = max(row[key]["q3"] for row in rows for key in ("ratio", "forward_backward_ratio"))
    ax_time.set_ylim(0, max(1.3, highest * 1.1))
    ax_time.legend(fontsize=8, loc="upper right")
    ax_time.set_title("below 1: ours is faster (bars: quartiles of the pairs)", fontsize=9)
    for offset, impl, color in ((-width / 2, "ours", "#4c72b0"), (width / 2, "torch", "#c44e52")):
        peaks = [max(resident + transient for resident, transient in row["peak_memory"][impl]) / 2**20 for row in rows]
        ax_memory.bar(
            [i + offset for i in range(len(rows))],
            peaks,
            width,
            color=color,
            label=IMPLEMENTATION_NAMES[impl],
            gid=f"memory-{impl}",
        )
    ax_memory.set_xticks(range(len(rows)), names)
    ax_memory.set_ylabel("peak memory, largest rank (MiB)")
    ax_memory.legend(fontsize=8, loc="lower right")
    ax_memory.set_title("resident state + the step's transient peak", fontsize=9)
    ranks = f" on {world_size} ranks" if world_size else ""
    fig.suptitle(f"Our fully_shard against torch FSDP2{ranks}, steps alternated in one run", fontsize=10)
    return fig


def implementation_timelines(bench_dir: str | Path, config: str) -> list[Figure]:
    """The traced step of each implementation of ``config``, as two timelines on one time scale."""
    traces = {}
    for impl in IMPLEMENTATION_NAMES:
        traces[impl] = load_traces(Path(bench_dir) / config / impl)
        if not traces[impl]:
            raise ValueError(f"no traces of {impl} for {config!r} in {bench_dir}; run python -m launch bench first")
    span = max(step_span(t) for t in traces.values())  # one scale, its unit labels spaced for it
    return [
        timeline(traces[impl], recipe=f"{config}, {name}", time_span=span)
        for impl, name in IMPLEMENTATION_NAMES.items()
    ]
