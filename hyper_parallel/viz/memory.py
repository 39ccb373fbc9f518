"""One rank's memory, part by part: the cost model's prediction beside a run's measurement (02_memory)."""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from hyper_parallel.viz.style import fmt_bytes, new_figure, round_byte_ticks

PART_COLORS = {
    "parameters": "#1f77b4",
    "gradients": "#ff7f0e",
    "optimizer": "#2ca02c",
    "kept_gathered": "#9467bd",
    "saved_activations": "#8c564b",
}
"""The parts of ``hyper_parallel.benchmark.memory_probe`` in the order they are stacked."""


def memory_bars(runs: Mapping[str, tuple[Mapping[str, int], Mapping[str, int]]], title: str = "") -> Figure:
    """For every run (label -> (predicted, measured) bytes per part), two stacked bars: the cost model's
    (hatched) above the measured one, so a part that differs shows as a shifted boundary."""
    labels = list(runs)
    fig = new_figure(11, 1.6 + 0.75 * len(labels))
    ax = fig.add_subplot()
    ax.set_label("memory")
    ticks, names = [], []
    for index, label in enumerate(labels):
        for offset, (kind, values) in enumerate(zip(("cost model", "measured"), runs[label])):
            y = index * 2.6 + offset
            left = 0
            for part, color in PART_COLORS.items():
                width = values[part]
                ax.barh(
                    y,
                    width,
                    left=left,
                    color=color,
                    hatch="//" if kind == "cost model" else None,
                    edgecolor="white",
                    height=0.8,
                    gid=f"{kind}:{part}",
                )
                left += width
            ax.text(left, y, f" {fmt_bytes(left)}", va="center", fontsize=8)
            ticks.append(y)
            names.append(f"{label} · {kind}")
    ax.set_yticks(ticks)
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("bytes on one rank")
    ax.margins(x=0.12)
    ax.set_xlim(left=0)  # bytes start at 0; the margin is for the totals written right of the bars
    round_byte_ticks(ax.xaxis, ax.get_xlim()[1])
    handles = [Patch(facecolor=c, label=p.replace("_", " ")) for p, c in PART_COLORS.items()]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="cost model (hatched)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    fig.suptitle(
        title or "One rank's memory kept through a step (no transient): the cost model's prediction and the run",
        fontsize=10,
    )
    return fig
