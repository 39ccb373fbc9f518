"""Shared look of the workbook's figures: rank, op, group and phase colours, titles, new figures.

Figures are plain ``matplotlib.figure.Figure`` objects with an Agg canvas: no pyplot state, nothing to
close, safe in scripts, tests and threads; Jupyter's inline backend displays a returned Figure.
"""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from hyper_parallel.cost_model.layouts import fmt_bytes  # noqa: F401 (the figures' and lessons' name for it)
from hyper_parallel.mesh_dims import WORLD_FACTORS, active_degrees

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send", "recv")
OP_COLORS = {
    "all_gather": "#1f77b4",
    "reduce_scatter": "#ff7f0e",
    "all_reduce": "#d62728",
    "all_to_all": "#2ca02c",
    "broadcast": "#9467bd",
    "send": "#8c564b",  # point-to-point: a ring's K/V blocks, a pipeline's activations
    "recv": "#e377c2",
}
OP_SHORT = {
    "all_gather": "AG",
    "reduce_scatter": "RS",
    "all_reduce": "AR",
    "all_to_all": "A2A",
    "broadcast": "BC",
    "send": "send",
    "recv": "recv",
}
GROUP_HATCHES = {
    "fsdp": "",
    "dp_shard": "",
    "dp_replicate": "///",
    "tp": "...",
    "cp": "xxx",
    "ep": "\\\\\\",
    "etp": "+++",
    "efsdp": "---",
    "dp_replicate+fsdp": "|||",
    "dp_replicate+efsdp": "|||",
    "dp": "ooo",
    "dp_cp": "OO",
}
_EXTRA_HATCHES = ("**", "oo", "//..", "\\\\..", "xx..", "--..")
PHASE_COLORS = {
    "init": "#eeeeee",
    "forward": "#dcebf7",
    "backward": "#fbe3d1",
    "optimizer": "#dff0d8",
    "other": "#f2f2f2",
}


def rank_color(rank: int, world_size: int = 8) -> tuple[float, float, float, float]:
    """The colour of one rank, the same in every figure of a run (tab10, tab20 beyond 10 ranks)."""
    if world_size <= 10:
        return to_rgba(matplotlib.colormaps["tab10"](rank % 10))
    if world_size <= 20:
        return to_rgba(matplotlib.colormaps["tab20"](rank % 20))
    return to_rgba(matplotlib.colormaps["hsv"](rank / world_size))


def group_color(index: int) -> tuple[float, float, float, float]:
    """Colour of the ``index``-th process group of a mesh dim (pastel, distinct from rank colours)."""
    palette = matplotlib.colormaps["Set3"] if index < 12 else matplotlib.colormaps["tab20b"]
    return to_rgba(palette(index % palette.N))


def group_hatch(group: str) -> str:
    if group in GROUP_HATCHES:
        return GROUP_HATCHES[group]
    return _EXTRA_HATCHES[sum(map(ord, group)) % len(_EXTRA_HATCHES)]


def title_degrees(degrees: dict[str, int] | Any | None) -> str:
    """'world 8 = dp_shard 2 × cp 2 × tp 2' (+ ' (experts: ep 2, etp 2)'): a figure title's degrees, those
    other than 1 outermost first (``mesh_dims.active_degrees``)."""
    if degrees is None:
        return ""
    if not isinstance(degrees, dict):
        degrees = degrees.degrees()
    active = active_degrees(degrees)
    dense = [f"{name} {value}" for name, value in active.items() if name in WORLD_FACTORS]
    text = f"world {degrees.get('world_size', '?')}"
    if dense:
        text += " = " + " × ".join(dense)
    sparse = [f"{name} {value}" for name, value in active.items() if name not in WORLD_FACTORS]
    if sparse:
        text += " (experts: " + ", ".join(sparse) + ")"
    return text


def title(what: str, recipe: str | None = None, degrees=None) -> str:
    parts = [what]
    head = " · ".join(p for p in (recipe, title_degrees(degrees)) if p)
    if head:
        parts.append(head)
    return " — ".join(parts)


FIGURE_DPI = 110
"""One resolution for a figure wherever it goes (a notebook's output, a saved PNG, a report), so that each
figure is rendered once (``png_bytes``)."""


def png_bytes(fig: Figure, dpi: int = FIGURE_DPI) -> bytes:
    """The figure as PNG, rendered once per resolution while it is unchanged: the bytes are kept on the
    figure, and any edit after the render marks it stale (matplotlib's own flag), which renders it anew."""
    kept = getattr(fig, "_png_bytes", None)
    if fig.stale or kept is None or kept[0] != dpi:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
        fig._png_bytes = kept = (dpi, buffer.getvalue())
        fig.stale = False  # savefig leaves it set; an artist changed from now on sets it again
    return kept[1]


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def round_byte_ticks(axis, top: float) -> None:
    """Ticks of a byte axis (``ax.xaxis`` or ``ax.yaxis``) reaching ``top`` at round numbers of B / KiB / MiB /
    GiB (50, 100, 150 KiB), not at round numbers of bytes (48.8, 97.7, 146.5 KiB)."""
    from matplotlib.ticker import MultipleLocator

    scale, unit = next(
        ((1024.0**k, u) for k, u in ((3, "GiB"), (2, "MiB"), (1, "KiB")) if top >= 1024.0**k * 2), (1.0, "B")
    )
    axis.set_major_locator(MultipleLocator(scale * _nice_step(top / scale / 6)))
    axis.set_major_formatter(lambda v, _: f"{v / scale:g} {unit}")


def _nice_step(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x a power of ten that is at least ``x``."""
    power = 10 ** math.floor(math.log10(x)) if x > 0 else 1
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= x)
