"""Build and write reports: read a run directory, draw its figures with ``hyper_parallel.viz``, render.

The figures are exactly ``run_figures``' (the ones ``launch run`` saves and the notebooks show), so
a report never disagrees with them. A figure that cannot be drawn is named on the page with the
reason instead of failing the report: the report of a broken run is the one people send.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hyper_parallel.run_files import REPORT_FILE, SUMMARY_FILE, write_atomic
from launch.report.page import render_page
from launch.report.predicted import at_scale, volume_rows
from launch.report.run_data import RunData, read_run
from launch.report.summary import losses_csv, summary_section, volume_csv


def _draw_figures(run: RunData) -> tuple[dict[str, Any], dict[str, str]]:
    """``run_figures(run_dir)``; when it fails, the mesh map alone, and why the others are missing."""
    from hyper_parallel.viz import FIGURE_SPECS, FIGURES, mesh_map, run_figures
    from hyper_parallel.viz.figure_registry import FROM_TRACES

    try:
        figures = run_figures(run.run_dir)
        no_traces = "the workers wrote no trace files (trace_rank*.json)"
        traced = [spec.name for spec in FIGURE_SPECS if spec.needs in FROM_TRACES]
        return figures, {name: no_traces for name in traced if name not in figures and not run.trace_ranks}
    except Exception as error:  # broken traces of a failed run: report it, draw what still can be drawn
        reason = f"drawing failed ({type(error).__name__}: {error})"
    figures: dict[str, Any] = {}
    try:
        from hyper_parallel.viz import dims_of

        figures["mesh"] = mesh_map(dims_of({"degrees": run.degrees}), run.recipe_name)
    except (TypeError, ValueError):
        pass
    return figures, {name: reason for name in FIGURES if name not in figures}


NOT_SHOWN = "the notebook did not show it; python -m launch report {run_dir} draws every figure"


def build_report(
    run_dir: str | Path,
    *,
    logs: dict[int, list[str]] | None = None,
    figures: dict[str, Any] | None = None,
    shown: dict[str, bytes] | None = None,
) -> str:
    """The HTML of ``run_dir``'s report. ``logs`` (rank -> lines, e.g. ``RunResult.logs``) replaces the
    log files; ``figures`` (``run_figures``' result, if already drawn) saves drawing them again.
    ``shown``: name -> the PNG a notebook saved of that figure; given, the page holds those bytes only and
    names every other figure with the command that draws it, drawing none."""
    run = read_run(run_dir, logs=logs)
    missing: dict[str, str] = {}
    if figures is None:
        figures, missing = _draw_figures(run)
    # the table has the figure's inputs: shown or not, it is there whenever the figure could be drawn
    volume = volume_rows(run) if "comm_volume" in figures else None
    if shown is not None:
        reason = NOT_SHOWN.format(run_dir=Path(run_dir))
        missing.update({name: reason for name in figures if name not in shown})
        figures = {name: shown[name] for name in figures if name in shown}
    summary = summary_section(run, volume, at_scale(run))
    downloads = {"numerics": losses_csv(run), "volume": volume_csv(volume)}
    return render_page(run, figures, missing=missing, volume=volume, summary=summary, downloads=downloads)


def write_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    *,
    logs: dict[int, list[str]] | None = None,
    figures: dict[str, Any] | None = None,
    shown: dict[str, bytes] | None = None,
) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``run_dir/report.html``; a folder, or a path
    without a suffix, gets ``report.html`` inside) and return its path (``figures``, ``shown``: as
    ``build_report``).

    ``ValueError`` when ``run_dir`` is missing or not a run directory."""
    page = build_report(run_dir, logs=logs, figures=figures, shown=shown)
    path = Path(out) if out is not None else Path(run_dir) / REPORT_FILE
    if path.is_dir() or not path.suffix:
        path = path / REPORT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, page).resolve()


def find_run_dirs(root: str | Path) -> list[Path]:
    """Every run directory under ``root`` (folders holding summary.json), in path order."""
    return sorted(path.parent for path in Path(root).rglob(SUMMARY_FILE))


def write_reports(root: str | Path, shown: str | Path | None = None) -> tuple[list[Path], list[str]]:
    """A report in every run directory under ``root``: (paths written, "run dir: problem" for the rest).
    ``shown``: the folder where a notebook saved the figures of those runs (``<shown>/<run>/<name>.png``
    for ``<root>/<run>``, as ``make workbook`` lays them out); the reports embed those PNGs as they are
    and draw no other (each names the figures it lacks and the command that draws them): drawing them
    cost ``make workbook`` 25 s of CPU, the largest share of its reports."""
    written, problems = [], []
    for run_dir in find_run_dirs(root):
        saved = Path(shown) / Path(run_dir).relative_to(root) if shown is not None else None
        pngs = {png.stem: png.read_bytes() for png in saved.glob("*.png")} if saved is not None else None
        try:
            written.append(write_report(run_dir, shown=pngs))
        except (OSError, ValueError) as error:
            problems.append(f"{run_dir}: {error}")
    return written, problems
