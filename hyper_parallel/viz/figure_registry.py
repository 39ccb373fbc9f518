"""The figures of a run as data: what each shows, what to notice in it, what it needs, how it is drawn.

``run_figures`` draws the ones a run directory has inputs for, the report captions them with ``title`` and
``notice`` (launch/report/figure_blocks.py) and names the input a missing one lacked, and docs/figures.md
describes each by its ``function`` (tests/test_docs.py checks that it does). A new run figure is its drawing
module and one row of ``FIGURE_SPECS``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from hyper_parallel.link import Link
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.run_files import write_atomic
from hyper_parallel.viz.mesh_map import mesh_map, parameters_sharded
from hyper_parallel.viz.numerics import numerics
from hyper_parallel.viz.placements import placement_overview, placement_transitions
from hyper_parallel.viz.style import png_bytes
from hyper_parallel.viz.timeline import timeline
from hyper_parallel.viz.volume import comm_volume

NEEDS = {
    "degrees": "the run has no valid degrees",
    "placements": "the traces hold no placement events",
    "collectives": "the traces hold no collectives",
    "losses": "no losses were recorded",
}
"""What a figure is drawn from, and why it is not drawn when the run lacks it."""
FROM_TRACES = ("placements", "collectives")


@dataclass(frozen=True)
class RunInputs:
    """What a run directory holds for its figures, and the choices ``run_figures`` was given."""

    metrics: dict[str, Any]
    traces: dict[int, list[dict]]
    dims: ParallelDims
    label: str | None  # how titles name the run (default: its recipe)
    step: int | None  # the step timeline and volume show (None: the last)
    param: str | None  # the parameter placement_transitions follows (None: a representative one)

    def has(self, needs: str) -> bool:
        """Whether the run holds what a figure ``needs`` (a key of ``NEEDS``)."""
        if needs == "degrees":
            return True  # the dims were built from them
        if needs == "losses":
            return bool(self.metrics.get("losses"))
        kind = {"placements": "placement", "collectives": "collective"}[needs]
        return any(e.get("kind") == kind for events in self.traces.values() for e in events)

    @property
    def link(self) -> Link | None:
        """The emulated link the run waited on (``hyper_parallel.link``), or None."""
        return Link.from_json(self.metrics.get("link"))

    @property
    def first_placement_step(self) -> int:
        return min(e["step"] for e in self.traces[min(self.traces)] if e.get("kind") == "placement")


@dataclass(frozen=True)
class FigureSpec:
    name: str  # the file name (name.png) and the key of run_figures' mapping
    function: str  # the hyper_parallel.viz function drawing it (docs/figures.md describes it)
    title: str
    notice: str  # what to look for in it
    needs: str  # a key of NEEDS
    draw: Callable[[RunInputs], Figure]


FIGURE_SPECS = (
    FigureSpec(
        "mesh",
        "mesh_map",
        "Mesh map",
        "Every rank on each parallel dim, coloured by process group: ranks of one colour communicate on that "
        "dim; TP is innermost, so its groups are contiguous ranks.",
        "degrees",
        lambda run: mesh_map(run.dims, run.label, sharded=parameters_sharded(run.metrics)),
    ),
    FigureSpec(
        "placements",
        "placement_transitions",
        "Placement transitions",
        "One parameter through a step: only the FSDP entry changes (sharded → gathered for compute → "
        "resharded); TP/EP entries stay.",
        "placements",
        lambda run: placement_transitions(
            run.traces, run.dims, param=run.param, step=run.first_placement_step, recipe=run.label
        ),
    ),
    FigureSpec(
        "placement_overview",
        "placement_overview",
        "Placements of every parameter",
        "Each parameter's placements before and after the all-gather: the FSDP axis differs from the axis "
        "TP/EP shard, where the tensor has one.",
        "placements",
        lambda run: placement_overview(run.traces, run.dims, step=run.first_placement_step, recipe=run.label),
    ),
    FigureSpec(
        "timeline",
        "timeline",
        "Timeline",
        "One step, a row per rank and group: all-gathers in forward, reduce-scatters (then HSDP's "
        "all-reduces) in backward; the gaps between bars are compute.",
        "collectives",
        lambda run: timeline(run.traces, step=run.step, recipe=run.label, degrees=run.dims, link=run.link),
    ),
    FigureSpec(
        "comm_volume",
        "comm_volume",
        "Communication volume against theory",
        "Bytes per op and group against fully_shard's minimum: ×1.00 is optimal, more means padding or an "
        "unexpected collective.",
        "collectives",
        lambda run: comm_volume(run.traces, run.metrics, step=run.step),
    ),
    FigureSpec(
        "numerics",
        "numerics",
        "Loss against the reference",
        "The parallel run's loss on top of the single-process reference: the curves must coincide "
        "(differences at fp32 rounding level).",
        "losses",
        lambda run: numerics(run.metrics),
    ),
)
FIGURES = tuple(spec.name for spec in FIGURE_SPECS)
SPECS = {spec.name: spec for spec in FIGURE_SPECS}


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

    def __contains__(self, name: object) -> bool:
        """Whether the run has the figure, without drawing it (``Mapping``'s own test asks ``__getitem__``,
        which draws: a report asking which of a run's figures exist drew every one, ~1 s a report)."""
        return name in self._builders

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
    from hyper_parallel.run_files import METRICS_FILE, SUMMARY_FILE, load_json, load_traces

    run_dir = Path(run_dir)
    metrics = load_json(run_dir / METRICS_FILE) or load_json(run_dir / SUMMARY_FILE)
    if not metrics:
        raise FileNotFoundError(f"{run_dir} has neither {METRICS_FILE} nor {SUMMARY_FILE}")
    run = RunInputs(metrics, load_traces(run_dir), dims_of(metrics), label or metrics.get("recipe"), step, param)
    builders = {spec.name: _drawer(spec, run) for spec in FIGURE_SPECS if run.has(spec.needs)}
    return RunFigures(builders, out_dir, svg)


def _drawer(spec: FigureSpec, run: RunInputs) -> Callable[[], Figure]:
    return lambda: spec.draw(run)
