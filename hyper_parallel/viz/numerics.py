"""Loss per step of a run against the single-process reference."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from hyper_parallel.viz.style import new_figure, title


def numerics(metrics: dict[str, Any]) -> Figure:
    """Top: the run's loss and the reference loss per step (lines ``"run"`` and ``"reference"``);
    bottom: |run - reference| per step on a log scale. The title gives the max differences of the
    losses and (if reported) of the parameters after the last step."""
    losses = list(metrics.get("losses") or [])
    reference = list(metrics.get("reference_losses") or [])
    if not losses:
        raise ValueError("metrics hold no losses")
    fig = new_figure(8, 5.4)
    grid = fig.add_gridspec(2, 1, height_ratios=[2.2, 1])
    ax = fig.add_subplot(grid[0])
    ax.set_label("loss")
    steps = list(range(len(losses)))
    ax.plot(steps, losses, "o-", color="#1f77b4", linewidth=2, markersize=7, label="run", zorder=3)
    if reference:
        ax.plot(
            range(len(reference)),
            reference,
            "x--",
            color="black",
            markersize=9,
            label="single-process reference",
            zorder=4,
        )
    ax.set_ylabel("loss")
    ax.set_xticks(steps)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    dax = fig.add_subplot(grid[1], sharex=ax)
    dax.set_label("difference")
    diffs = [abs(a - b) for a, b in zip(losses, reference)]
    if diffs:
        floor = 1e-12
        dax.bar(range(len(diffs)), [max(d, floor) for d in diffs], 0.5, color="#ff7f0e")
        dax.set_yscale("log")
        dax.set_ylim(floor, max(max(diffs) * 10, 1e-5))
        for i, d in enumerate(diffs):
            dax.text(i, max(d, floor) * 1.5, f"{d:.1e}", ha="center", va="bottom", fontsize=8)
    dax.set_ylabel("|run − ref|")
    dax.set_xlabel("training step")
    dax.grid(alpha=0.3, axis="y")
    max_diff = metrics.get("max_abs_diff", max(diffs) if diffs else float("nan"))
    line = f"max |loss − reference| = {max_diff:.2e}"
    if metrics.get("max_param_diff") is not None:
        line += f" · max |param − reference| = {metrics['max_param_diff']:.2e}"
    verdict = {True: "matches the reference", False: "DOES NOT match the reference"}.get(metrics.get("ok"), "")
    fig.suptitle(
        title("Loss vs single-process reference", metrics.get("recipe"), metrics.get("degrees"))
        + f"\n{line}"
        + (f" — {verdict}" if verdict else ""),
        fontsize=10,
    )
    return fig


def numerics_compared(runs: dict[str, dict[str, Any]], floor: float = 1e-12) -> Figure:
    """Several runs of one model against the same reference in one figure: |loss − reference| per step, a
    bar per run (log scale, ``floor`` for an exact 0), and each run's largest parameter difference after
    the last step in its legend entry. Where two loss curves lie on top of each other this still shows
    which run drifts and by how many orders of magnitude (10_pure_tp_fix: without and with the fix)."""
    if not runs or not all(metrics.get("losses") for metrics in runs.values()):
        raise ValueError(f"every run needs losses; got {sorted(runs)}")
    fig = new_figure(8, 3.4)
    ax = fig.add_subplot()
    ax.set_label("differences")
    width = 0.8 / len(runs)
    top = floor
    for index, (label, metrics) in enumerate(runs.items()):
        diffs = [abs(a - b) for a, b in zip(metrics["losses"], metrics.get("reference_losses") or [])]
        xs = [step - 0.4 + width * (index + 0.5) for step in range(len(diffs))]
        param = metrics.get("max_param_diff")
        legend = label + (f" (params after the last step: {param:.1e})" if param is not None else "")
        ax.bar(xs, [max(d, floor) for d in diffs], width * 0.9, label=legend, gid=f"run:{label}")
        for x, d in zip(xs, diffs):
            ax.text(x, max(d, floor) * 1.5, f"{d:.1e}", ha="center", va="bottom", fontsize=8)
        top = max([top, *diffs])
    ax.set_yscale("log")
    ax.set_ylim(floor, max(top * 100, 1e-5))
    ax.set_xticks(range(max(len(m["losses"]) for m in runs.values())))
    ax.set_xlabel("training step")
    ax.set_ylabel("|loss − reference|")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("each run's loss against the single-process reference, step by step", fontsize=10)
    return fig
