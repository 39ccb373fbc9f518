"""What a notebook cell calls to run something, so the cell stays one call: recipes on torchrun
against their references, the figures of a run, the message of an invalid mesh, the CLI in a subprocess.

    run_recipes({"M4": m4, "M7": m7}, steps=2, out=runs_dir)   one torchrun launch per world size
    figures(result, figures_dir)          every figure of a run (saved as PNG + SVG when figures_dir is set)
    show_figures(result, figures_dir)     the same, displayed with a heading each
    expect_invalid(recipe, **degrees)     the ValueError message of an invalid mesh (fails if it is valid)
    cli("check", "--world", "3", ...)     ``python -m launch ...`` in a subprocess: exit code and output

Torch, ``launch.runs`` and IPython are imported only when a function needs them.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def run_recipes(
    runs: Mapping[str, Mapping[str, int]],
    *,
    steps: int | None = None,
    out: str | Path | None = None,
    timeout: float = 600.0,
    seed: int = 0,
    verbose: bool = True,
) -> dict[str, Any]:
    """Run recipes against their single-process references, one launch per world size (largest first).

    ``runs`` maps a label to degrees (``{"M4": {"world_size": 2, "dp_shard": 2}}``) and options
    (``"microbatches": 2``, see ``launch.run``); the label is the recipe unless the degrees hold ``"recipe"``; ``"overlap": False`` runs it with every collective
    synchronous. Every run is validated before anything starts (a bad
    mesh raises ``ValueError`` at once). Prints a line per step and per run; returns label -> RunResult.
    Run directories: ``out/<label>`` (default: a temporary folder), each with a Chrome trace
    ``chrome_trace.json`` (open it in Perfetto).
    """
    from hyper_parallel.run_files import CHROME_TRACE_FILE, to_chrome_trace
    from launch.notebook.widgets.display import step_text
    from launch.processes.run_dirs import new_scratch_dir
    from launch.runs import resolve_run, run_many

    prepared: dict[int, list[tuple[str, Any]]] = {}
    for label, given in runs.items():
        given = dict(given)
        spec = resolve_run(given.pop("recipe", label), steps=steps, seed=seed, **given)
        prepared.setdefault(spec.dims.world_size, []).append((label, spec))
    root = Path(out) if out is not None else new_scratch_dir("hp-notebook-")
    results: dict[str, Any] = {}

    def progress(update: dict) -> None:
        if verbose:
            print(f"  {update.get('recipe', '')} {step_text(update)}", flush=True)

    # the largest world size first: the warm pool starts at its final size, where growing it means a second
    # cold start (04's M5 on 4 ranks, M6 on 8, then M5's schemes on 4 started it twice)
    for world, group in sorted(prepared.items(), key=lambda item: -item[0]):
        labels = [label for label, _ in group]
        if verbose:
            print(
                f"launching {world} ranks for {', '.join(labels)} (one torchrun, runs one after another) ...",
                flush=True,
            )
        outcome = run_many(
            [dataclasses.replace(spec, out=root / label) for label, spec in group],
            timeout=timeout,
            out=root,
            on_progress=progress,
        )
        for label, result in zip(labels, outcome):
            results[label] = result
            if result.traces:
                to_chrome_trace(result.traces, Path(result.run_dir) / CHROME_TRACE_FILE)
            if verbose:
                print(status_line(label, result), flush=True)
    return {label: results[label] for label in runs}


def status_line(label: str, result) -> str:
    """One line per run for a notebook: OK or FAILED, the degrees, and the numbers against the reference."""
    summary = result.summary()
    degrees = ", ".join(f"{k}={v}" for k, v in summary["degrees"].items() if k != "world_size" and v != 1)
    head = f"{'OK    ' if result.ok else 'FAILED'} {label} (world_size={summary['degrees']['world_size']}: {degrees})"
    if result.ok:
        return (
            f"{head}: max |loss - reference| = {summary['max_abs_diff']:.3g}, "
            f"max |param - reference| = {summary['max_param_diff']:.3g}"
        )
    return f"{head}:\n{result.error}"


def figures(result, figures_dir: str | Path | None = None, label: str | None = None, **options) -> Mapping[str, Any]:
    """The figures of a run by name (``hyper_parallel.viz.run_figures``): each drawn when first shown, and
    then saved under ``figures_dir/<label>``."""
    from hyper_parallel.viz import run_figures

    out_dir = Path(figures_dir) / (label or Path(result.run_dir).name) if figures_dir is not None else None
    return run_figures(result.run_dir, out_dir=out_dir, label=label, **options)


def show_figures(
    result,
    figures_dir: str | Path | None = None,
    label: str | None = None,
    names: Iterable[str] | None = None,
    **options,
) -> Mapping[str, Any]:
    """``figures`` and display them (all, or ``names``) each under a small heading."""
    from IPython.display import Markdown, display

    label = label or Path(result.run_dir).name
    drawn = figures(result, figures_dir, label, **options)
    for name in names or drawn:
        if name in drawn:
            display(Markdown(f"**{label} · {name.replace('_', ' ')}**"))
            display(drawn[name])
    return drawn


def expect_invalid(recipe: str, **degrees: int) -> str:
    """The rule's message for an invalid run (``launch.validate``); AssertionError if it is valid."""
    from launch.runs import validate

    try:
        _, dims = validate(recipe, **degrees)
    except ValueError as error:
        return str(error)
    raise AssertionError(f"{recipe} {degrees} is valid ({dims.describe().splitlines()[0]}); expected an error")


def cli(*args: str, timeout: float = 120.0, show: bool = True) -> subprocess.CompletedProcess:
    """``python -m launch ARGS`` in a subprocess (the notebook's Python); prints command, exit code, output."""
    command = [sys.executable, "-m", "launch", *map(str, args)]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    done.seconds = time.monotonic() - start
    if show:
        print(f"$ python -m launch {' '.join(map(str, args))}\nexit code {done.returncode} after {done.seconds:.2f}s")
        for text in (done.stdout, done.stderr):
            if text.strip():
                print(text.rstrip())
    return done
