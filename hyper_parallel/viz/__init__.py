"""Figures of the workbook, drawn from run files with matplotlib (no torch.distributed needed).

    concept_figure(style)                           what a style splits, where its collectives go
    ideal_timeline(ideal_schedule(...))             an idealized step (one rank, no waiting)
    mesh_map(dims, recipe)                          ranks on the mesh, one panel per parallel dim
    placement_transitions(traces, dims, param)      one parameter: sharded -> unsharded -> resharded
    placement_overview(traces, dims, module)        table of every parameter's placements
    timeline(traces, step)                          per-rank collectives of one step
    comm_volume(traces, metrics, step)              bytes per (op, group) vs fully_shard's minimum
    numerics(metrics)                               loss vs the single-process reference
    save(fig, out_dir, name, svg=False)             PNG (and SVG)
    run_figures(run_dir, out_dir)                   all of the above for one run directory, each drawn when asked for

Every function returns a ``matplotlib.figure.Figure`` with its own Agg canvas (no pyplot state): a
notebook displays it when returned from a cell, a script saves it; nothing needs closing.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.run_files import FIGURES, write_atomic
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


def save(fig: Figure, out_dir: str | Path, name: str, svg: bool = False) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` (``FIGURE_DPI``: the bytes a notebook shows) and, with ``svg``,
    ``<name>.svg``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png"] + ([out / f"{name}.svg"] if svg else [])
    write_atomic(paths[0], png_bytes(fig))
    if svg:
        svg_text = io.BytesIO()
        fig.savefig(svg_text, format="svg")
        write_atomic(paths[1], svg_text.getvalue())
    return paths


class RunFigures(Mapping[str, Figure]):
    """The figures of one run by name, each drawn (and saved, with ``out_dir``) the first time it is asked
    for: a notebook that shows two of a run's six figures pays for two. Iterating lists every name the
    run has inputs for; ``dict(figures)`` draws them all."""

    def __init__(
        self, builders: dict[str, Callable[[], Figure]], out_dir: str | Path | None, svg: bool = False
    ) -> None:
        self._builders, self._out_dir, self._svg = builders, out_dir, svg
        self._drawn: dict[str, Figure] = {}

    def __getitem__(self, name: str) -> Figure:
        if name not in self._drawn:
            fig = self._builders[name]()  # KeyError for a name the run has no figure of, as a dict
            if self._out_dir is not None:
                save(fig, self._out_dir, name, svg=self._svg)
            self._drawn[name] = fig
        return self._drawn[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._builders)

    def __len__(self) -> int:
        return len(self._builders)

    def __repr__(self) -> str:
        return f"RunFigures({list(self._builders)}, drawn: {list(self._drawn)})"


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
    svg: bool = False,
) -> RunFigures:
    """The figures of one run directory (``FIGURES`` order), each drawn when first asked for and then saved
    as PNG (and SVG, with ``svg``) when ``out_dir`` is given. Titles name the run by ``label`` (e.g.
    "M7 + CP"), else by its recipe.

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
    builders: dict[str, Callable[[], Figure]] = {
        "mesh": lambda: mesh_map(dims, recipe, sharded=parameters_sharded(metrics))
    }
    if any(e.get("kind") == "placement" for events in traces.values() for e in events):
        first = min(e["step"] for e in traces[min(traces)] if e.get("kind") == "placement")
        builders["placements"] = lambda: placement_transitions(traces, dims, param=param, step=first, recipe=recipe)
        builders["placement_overview"] = lambda: placement_overview(traces, dims, step=first, recipe=recipe)
    if any(e.get("kind") == "collective" for events in traces.values() for e in events):
        builders["timeline"] = lambda: timeline(traces, step=step, recipe=recipe, degrees=dims)
        builders["comm_volume"] = lambda: comm_volume(traces, metrics, step=step)
    if metrics.get("losses"):
        builders["numerics"] = lambda: numerics(metrics)
    return RunFigures(builders, out_dir, svg)
