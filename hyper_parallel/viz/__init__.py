"""Figures of the workbook, drawn from run files with matplotlib (no torch.distributed needed).

    concept_figure(style)                           what a style splits, where its collectives go
    ideal_timeline(ideal_schedule(...))             an idealized step (one rank, no waiting)
    mesh_map(dims, recipe)                          ranks on the mesh, one panel per parallel dim
    placement_transitions(traces, dims, param)      one parameter: sharded -> unsharded -> resharded
    placement_overview(traces, dims, module)        table of every parameter's placements
    timeline(traces, step)                          per-rank collectives of one step
    comm_volume(traces, metrics, step)              bytes per (op, group) vs fully_shard's minimum
    numerics(metrics)                               loss vs the single-process reference
    save(fig, out_dir, name)                        PNG + SVG
    run_figures(run_dir, out_dir)                   all of the above for one run directory

Every function returns a ``matplotlib.figure.Figure`` with its own Agg canvas (no pyplot state): a
notebook displays it when returned from a cell, a script saves it; nothing needs closing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.viz.concepts import concept_figure, ideal_timeline
from hyper_parallel.viz.ideal_step import cp_chunks, ideal_schedule
from hyper_parallel.viz.layout import ownership, parse_placements, rank_ranges
from hyper_parallel.viz.mesh_map import mesh_map, parameters_sharded
from hyper_parallel.viz.numerics import numerics
from hyper_parallel.viz.pipeline import measured_bubble, pipeline_schedule
from hyper_parallel.viz.placements import (
    placement_overview,
    placement_transitions,
    representative_param,
)
from hyper_parallel.viz.style import rank_color
from hyper_parallel.viz.timeline import clock_offsets, timeline, timeline_notes
from hyper_parallel.viz.volume import (
    comm_volume,
    theoretical_bytes,
    wire_bytes,
    wire_factor,
)

__all__ = [
    "FIGURES",
    "clock_offsets",
    "comm_volume",
    "concept_figure",
    "cp_chunks",
    "ideal_schedule",
    "ideal_timeline",
    "measured_bubble",
    "mesh_map",
    "numerics",
    "ownership",
    "parameters_sharded",
    "parse_placements",
    "pipeline_schedule",
    "placement_overview",
    "placement_transitions",
    "rank_color",
    "rank_ranges",
    "representative_param",
    "run_figures",
    "save",
    "theoretical_bytes",
    "timeline",
    "timeline_notes",
    "wire_bytes",
    "wire_factor",
]

FIGURES = ("mesh", "placements", "placement_overview", "timeline", "comm_volume", "numerics")


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
        formatter.for_type(Figure, _png_bytes)


def _png_bytes(fig: Figure) -> bytes:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


_enable_notebook_display()


def save(fig: Figure, out_dir: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.png`` (150 dpi) and ``<name>.svg``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png, svg = out / f"{name}.png", out / f"{name}.svg"
    fig.savefig(png, dpi=150)
    fig.savefig(svg)
    return png, svg


def dims_of(metrics: dict[str, Any]) -> ParallelDims:
    degrees = dict(metrics.get("degrees") or {})
    if not degrees:
        raise ValueError("metrics.json has no 'degrees'; cannot rebuild the mesh")
    return ParallelDims(**{k: v for k, v in degrees.items() if k in ParallelDims.__dataclass_fields__})


def run_figures(
    run_dir: str | Path,
    out_dir: str | Path | None = None,
    step: int | None = None,
    param: str | None = None,
    label: str | None = None,
) -> dict[str, Figure]:
    """Every figure of one run directory (``FIGURES`` order), saved as PNG + SVG when ``out_dir`` is given.
    Titles name the run by ``label`` (e.g. "M7 + CP"), else by its recipe.

    The placement figures show step 0 and ``param`` (default: ``representative_param``, a TP/EP-sharded
    2-D weight if there is one); timeline and volume show ``step`` (default: the last step).
    Figures whose inputs are missing (no traces, no losses) are left out.
    """
    from hyper_parallel.run_files import (
        METRICS_FILE,
        SUMMARY_FILE,
        load_json,
        load_traces,
    )

    run_dir = Path(run_dir)
    metrics = load_json(run_dir / METRICS_FILE) or load_json(run_dir / SUMMARY_FILE)
    if not metrics:
        raise FileNotFoundError(f"{run_dir} has neither {METRICS_FILE} nor {SUMMARY_FILE}")
    dims, recipe = dims_of(metrics), label or metrics.get("recipe")
    traces = load_traces(run_dir)
    figures: dict[str, Figure] = {"mesh": mesh_map(dims, recipe, sharded=parameters_sharded(metrics))}
    has_placements = any(e.get("kind") == "placement" for events in traces.values() for e in events)
    if has_placements:
        first = min(e["step"] for e in traces[min(traces)] if e.get("kind") == "placement")
        figures["placements"] = placement_transitions(traces, dims, param=param, step=first, recipe=recipe)
        figures["placement_overview"] = placement_overview(traces, dims, step=first, recipe=recipe)
    if any(e.get("kind") == "collective" for events in traces.values() for e in events):
        figures["timeline"] = timeline(traces, step=step, recipe=recipe, degrees=dims)
        figures["comm_volume"] = comm_volume(traces, metrics, step=step)
    if metrics.get("losses"):
        figures["numerics"] = numerics(metrics)
    if out_dir is not None:
        for name, fig in figures.items():
            save(fig, out_dir, name)
    return figures
