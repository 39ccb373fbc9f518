"""Figures of the workbook, drawn from run files with matplotlib (no torch.distributed needed).

    concept_figure(style)                           what a style splits, where its collectives go
    ideal_timeline(ideal_schedule(...))             an idealized step (one rank, no waiting)
    mesh_map(dims, recipe)                          ranks on the mesh, one panel per parallel dim
    placement_transitions(traces, dims, param)      one parameter: sharded -> unsharded -> resharded
    placement_overview(traces, dims, module)        table of every parameter's placements
    timeline(traces, step)                          per-rank collectives of one step
    comm_volume(traces, metrics, step)              bytes per (op, group) vs fully_shard's minimum
    numerics(metrics)                               loss vs the single-process reference
    numerics_compared({label: metrics})             several runs' |loss - reference| per step, one figure
    save(fig, out_dir, name, svg=False)             PNG (and SVG)
    run_figures(run_dir, out_dir)                   all of the above for one run directory, each drawn when asked for
    FIGURE_SPECS                                    those figures as data: title, what to notice, what each needs

Every function returns a ``matplotlib.figure.Figure`` with its own Agg canvas (no pyplot state): a
notebook displays it when returned from a cell, a script saves it; nothing needs closing.
"""

from __future__ import annotations

import sys

from matplotlib.figure import Figure

from hyper_parallel.viz.concepts import concept_figure, ideal_timeline
from hyper_parallel.viz.figure_registry import (
    FIGURE_SPECS,
    FIGURES,
    FigureSpec,
    RunFigures,
    dims_of,
    run_figures,
    save,
)
from hyper_parallel.viz.ideal_step import cp_chunks, ideal_schedule
from hyper_parallel.viz.layout import ownership, parse_placements, rank_ranges
from hyper_parallel.viz.mesh_map import mesh_map, parameters_sharded
from hyper_parallel.viz.numerics import numerics, numerics_compared
from hyper_parallel.viz.pipeline import measured_bubble, pipeline_schedule
from hyper_parallel.viz.placements import (
    placement_overview,
    placement_transitions,
    representative_param,
)
from hyper_parallel.viz.style import FIGURE_DPI, png_bytes, rank_color
from hyper_parallel.viz.timeline import clock_offsets, timeline, timeline_notes
from hyper_parallel.viz.volume import (
    comm_volume,
    theoretical_bytes,
    wire_bytes,
    wire_factor,
)

__all__ = [
    "FIGURES",
    "FIGURE_SPECS",
    "FigureSpec",
    "dims_of",
    "FIGURE_DPI",
    "clock_offsets",
    "comm_volume",
    "concept_figure",
    "cp_chunks",
    "ideal_schedule",
    "ideal_timeline",
    "measured_bubble",
    "mesh_map",
    "numerics",
    "numerics_compared",
    "ownership",
    "parameters_sharded",
    "parse_placements",
    "pipeline_schedule",
    "placement_overview",
    "placement_transitions",
    "png_bytes",
    "rank_color",
    "rank_ranges",
    "representative_param",
    "RunFigures",
    "run_figures",
    "save",
    "theoretical_bytes",
    "timeline",
    "timeline_notes",
    "wire_bytes",
    "wire_factor",
]


def _enable_notebook_display() -> None:
    """In IPython/Jupyter, show a returned Figure as a PNG (a bare Figure would print as text unless the
    inline backend happens to be active); the user's matplotlib backend is left alone."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None:
        return
    formatter = shell.display_formatter.formatters["image/png"]
    try:
        formatter.lookup_by_type(Figure)
    except KeyError:
        formatter.for_type(Figure, png_bytes)


_enable_notebook_display()
