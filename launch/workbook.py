"""The workbook: run the notebooks headless (``make workbook``), and the helpers those notebooks call.

    python -m launch workbook --out runs      every notebook in notebooks/ through papermill into
                                              runs/<timestamp>/: executed .ipynb, figures/, run data,
                                              a report.html in every run directory

Helpers for the notebooks (so their cells stay one call each):

    run_recipes({"M4": m4, "M7": m7}, steps=2, out=runs_dir)   one torchrun launch per world size
    figures(result, figures_dir)          every figure of a run (saved as PNG + SVG when figures_dir is set)
    show_figures(result, figures_dir)     the same, displayed with a heading each
    groupinfo_table(results)              per fully_shard unit: shard/dp/rank sizes, RS and AR groups
    collective_table(results)             collectives of the last step per (op, group)
    numbers_table(results)                loss per step against the single-process reference
    expect_invalid(recipe, **degrees)     the ValueError message of an invalid mesh (fails if it is valid)
    cli("check", "--world", "3", ...)     ``python -m launch ...`` in a subprocess: exit code and output
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
FIGURE_PARAMETER, RUNS_PARAMETER = "figures_dir", "runs_dir"


# ====================================================================== running the workbook

READING_ORDER = (
    "00_start_here",
    "10_ddp_fsdp",
    "11_tensor_sequence_parallel",
    "13_hsdp",
    "12_context_parallel",
    "14_moe_expert_parallel",
    "01_mesh_algebra",
    "15_pipeline_parallel",
    "02_fully_shard_groupinfo",
    "03_pure_tp_fix",
    "04_planning_at_scale",
    "05_your_own_model",
    "90_negative_cases",
    "95_performance",
    "91_recipe_matrix",
)
"""The learning path: concepts before mechanics (each style in 10-14 before 01-04 combine them;
pipelines, 15, once the mesh of 01 is known), the appendix last. File names keep their numbers (tests and links use them); 00 and every notebook's
"Next:" link give this order."""


def notebooks(folder: str | Path = NOTEBOOKS_DIR) -> list[Path]:
    """The workbook's notebooks in reading order (``READING_ORDER``; any other notebook after them, by name)."""
    found = sorted(p for p in Path(folder).glob("*.ipynb") if not p.name.startswith("."))
    rank = {name: i for i, name in enumerate(READING_ORDER)}
    return sorted(found, key=lambda p: (rank.get(p.stem, len(rank)), p.name))


def execute_notebook(
    path: str | Path, output: str | Path, parameters: Mapping[str, Any] | None = None, timeout: float = 900.0
) -> tuple[bool, str]:
    """Run one notebook with papermill (cwd: its folder); returns (ok, error summary or "")."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    path, output = Path(path), Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        papermill.execute_notebook(
            str(path),
            str(output),
            parameters=dict(parameters or {}),
            cwd=str(path.parent),
            progress_bar=False,
            log_output=False,
            request_save_on_cell_execute=False,
            execution_timeout=timeout,
            # the kernel's own log is noise here (TCP-without-encryption warning on loopback,
            # the KeyboardInterrupt of jupyter_client's shutdown); cell errors still fail the run
            extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
        )
    except PapermillExecutionError as error:
        return (
            False,
            f"cell {error.exec_count}: {error.ename}: {str(error.evalue).splitlines()[0] if error.evalue else ''}",
        )
    except Exception as error:  # kernel died, timeout, bad notebook
        return False, f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return True, ""


def run_workbook(
    out: str | Path,
    only: Iterable[str] | None = None,
    parameters: Mapping[str, Mapping] | None = None,
    notebooks_dir: str | Path = NOTEBOOKS_DIR,
) -> int:
    """Execute every notebook into ``out/<timestamp>/``; print one status line per notebook; 1 if any failed.

    Each notebook gets ``figures_dir=<root>/figures/<notebook>`` and ``runs_dir=<root>/runs/<notebook>``;
    ``only`` restricts to notebooks whose name starts with one of the given prefixes; ``parameters``
    maps a notebook name (stem) to extra papermill parameters.
    """
    only = list(only) if only is not None else None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = (Path(out) / stamp).resolve()
    root.mkdir(parents=True, exist_ok=True)
    chosen = [p for p in notebooks(notebooks_dir) if only is None or any(p.stem.startswith(prefix) for prefix in only)]
    if not chosen:
        print(
            f"found no notebooks in {Path(notebooks_dir).resolve()}"
            + (f" starting with {only}" if only else "")
            + ": the notebooks live in the repository's notebooks/ folder, not in the installed package; "
            "run this from a clone of the repository",
            file=sys.stderr,
        )
        return 1
    print(f"running {len(chosen)} notebooks into {root}", flush=True)
    from launch.report import write_reports

    start, failed, reports = time.monotonic(), [], []
    for path in chosen:
        params = {
            FIGURE_PARAMETER: str(root / "figures" / path.stem),
            RUNS_PARAMETER: str(root / "runs" / path.stem),
            **dict((parameters or {}).get(path.stem, {})),
        }
        began = time.monotonic()
        ok, error = execute_notebook(path, root / path.name, params)
        pngs = len(list((root / "figures" / path.stem).rglob("*.png")))
        written, problems = write_reports(root / "runs" / path.stem)  # one report.html per run directory
        reports += written
        status = "OK    " if ok else "FAILED"
        print(
            f"{status} {path.stem:<30} {time.monotonic() - began:6.1f}s  {pngs:3d} figures  {len(written):2d} reports"
            + (f"  {error}" if error else ""),
            flush=True,
        )
        for problem in problems:
            print(f"       no report for {problem}", flush=True)
        if not ok:
            failed.append(path.stem)
    total = time.monotonic() - start
    print(f"workbook written to {root} ({len(chosen)} notebooks, {len(failed)} failed, {total:.0f}s)")
    print(
        f"  executed notebooks: {root}/*.ipynb\n  figures (PNG + SVG): {root}/figures/<notebook>/<run>/"
        f"\n  run data (metrics, traces, Chrome traces): {root}/runs/<notebook>/<run>/"
    )
    print(f"  reports (self-contained HTML, one per run): {len(reports)}")
    for report in reports:
        print(f"    {report.relative_to(root)}")
    if failed:
        print("failed: " + ", ".join(failed) + " (open the executed notebook to see the failing cell)")
    return 1 if failed else 0


# ====================================================================== helpers for the notebooks


def run_recipes(
    runs: Mapping[str, Mapping[str, int]],
    *,
    steps: int | None = None,
    out: str | Path | None = None,
    timeout: float = 600.0,
    seed: int = 0,
    verbose: bool = True,
) -> dict[str, Any]:
    """Run recipes against their single-process references, one torchrun launch per world size.

    ``runs`` maps a label to degrees (``{"M4": {"world_size": 2, "dp_shard": 2}}``); the label is the
    recipe unless the degrees hold ``"recipe"``; ``"overlap": False`` runs it with every collective
    synchronous. Every run is validated before anything starts (a bad
    mesh raises ``ValueError`` at once). Prints a line per step and per run; returns label -> RunResult.
    Run directories: ``out/<label>`` (default: a temporary folder), each with a Chrome trace
    ``chrome_trace.json`` (open it in Perfetto).
    """
    from hyper_parallel.run_files import CHROME_TRACE_FILE, to_chrome_trace
    from launch.run_dirs import new_scratch_dir
    from launch.runner import run_many, validate
    from launch.widgets.display import step_text

    prepared: dict[int, list[tuple[str, dict]]] = {}
    for label, given in runs.items():
        given = dict(given)
        recipe, overlap = given.pop("recipe", label), given.pop("overlap", None)
        _, dims = validate(recipe, **given)
        spec = {"recipe": recipe, "steps": steps, "seed": seed, "overlap": overlap, **dims.degrees()}
        prepared.setdefault(dims.world_size, []).append((label, spec))
    root = Path(out) if out is not None else new_scratch_dir("hp-notebook-")
    results: dict[str, Any] = {}

    def progress(update: dict) -> None:
        if verbose:
            print(f"  {update.get('recipe', '')} {step_text(update)}", flush=True)

    for world, group in prepared.items():
        labels = [label for label, _ in group]
        if verbose:
            print(
                f"launching {world} ranks for {', '.join(labels)} (one torchrun, runs one after another) ...",
                flush=True,
            )
        outcome = run_many(
            [spec for _, spec in group],
            timeout=timeout,
            out=root,
            run_dirs=[root / label for label in labels],
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
    summary = result.summary()
    degrees = ", ".join(f"{k}={v}" for k, v in summary["degrees"].items() if k != "world_size" and v != 1)
    head = f"{'OK    ' if result.ok else 'FAILED'} {label} (world_size={summary['degrees']['world_size']}: {degrees})"
    if result.ok:
        return (
            f"{head}: max |loss - reference| = {summary['max_abs_diff']:.3g}, "
            f"max |param - reference| = {summary['max_param_diff']:.3g}"
        )
    return f"{head}:\n{result.error}"


def figures(result, figures_dir: str | Path | None = None, label: str | None = None, **options) -> dict[str, Any]:
    """Every figure of a run (``hyper_parallel.viz.run_figures``), saved under ``figures_dir/<label>``."""
    from hyper_parallel.viz import run_figures

    out_dir = Path(figures_dir) / (label or Path(result.run_dir).name) if figures_dir is not None else None
    return run_figures(result.run_dir, out_dir=out_dir, label=label, **options)


def show_figures(
    result,
    figures_dir: str | Path | None = None,
    label: str | None = None,
    names: Iterable[str] | None = None,
    **options,
) -> dict[str, Any]:
    """``figures`` and display them (all, or ``names``) each under a small heading."""
    from IPython.display import Markdown, display

    label = label or Path(result.run_dir).name
    drawn = figures(result, figures_dir, label, **options)
    for name in names or drawn:
        if name in drawn:
            display(Markdown(f"**{label} · {name.replace('_', ' ')}**"))
            display(drawn[name])
    return drawn


def _decision(unit: Mapping[str, Any]) -> str:
    return gradient_reduction(unit["shard_size"], unit["dp_size"])


def gradient_reduction(shard: int, dp: int) -> str:
    """How a unit's gradients are reduced, from its GroupInfo sizes (the decision table of 02):
    ``RS(shard) + AR(dp)``, ``RS(shard)``, ``AR(dp)`` or ``no communication``."""
    if shard > 1:
        return f"RS({shard})" + (f" + AR({dp})" if dp > 1 else "")
    return f"AR({dp})" if dp > 1 else "no communication"


def groupinfo_table(results: Mapping[str, Any]):
    """One row per fully_shard unit of each run: GroupInfo sizes, groups and the RS/AR decision."""
    from launch.html_table import table

    rows = []
    for label, result in results.items():
        for unit in result.metrics.get("units", []):
            rows.append(
                [
                    label,
                    unit["unit"],
                    unit["rank_size"],
                    unit["shard_size"],
                    unit["dp_size"],
                    f"{unit['sharded_group']['name'] or '-'} {unit['sharded_group']['ranks']}",
                    f"{unit['unsharded_group']['name'] or '-'} {unit['unsharded_group']['ranks']}",
                    _decision(unit),
                ]
            )
    return table(
        [
            "run",
            "unit",
            "rank_size",
            "shard_size",
            "dp_size",
            "sharded group (RS), rank 0's",
            "unsharded group (AR), rank 0's",
            "gradient reduction",
        ],
        rows,
        caption="GroupInfo per fully_shard unit (rank 0's view): rank_size = shard_size x dp_size",
    )


def collective_counts(result, step: int | None = None, rank: int = 0) -> Counter:
    """(phase, op, group) -> number of collectives rank ``rank`` issued in ``step`` (default: the last);
    ``result``: a RunResult or its traces ({rank: events})."""
    traces = result if isinstance(result, Mapping) else result.traces
    events = [e for e in traces.get(rank, []) if e.get("kind") == "collective" and e.get("phase") != "init"]
    if not events:
        return Counter()
    step = max(e["step"] for e in events) if step is None else step
    return Counter((e["phase"], e["op"], e["group"]) for e in events if e["step"] == step)


def collective_table(results: Mapping[str, Any], step: int | None = None):
    """Collectives of rank 0 in one step (default: the last) per run, phase, op and group."""
    from launch.html_table import table

    rows = []
    for label, result in results.items():
        counts = collective_counts(result, step)
        for (phase, op, group), count in sorted(counts.items()):
            rows.append([label, phase, op, group, count])
        if not counts:
            rows.append([label, "-", "no collectives", "-", 0])
    return table(["run", "phase", "op", "group", "count"], rows, caption="collectives of rank 0 in the last step")


def exposure_table(results: Mapping[str, Any], step: int | None = None):
    """Per run and rank: ms of the step with a collective in flight, of those with no compute running
    (exposed), and hidden behind compute (``hyper_parallel.viz.overlap``)."""
    from hyper_parallel.viz.overlap import exposure
    from hyper_parallel.viz.timeline import steps_of
    from launch.html_table import table

    rows = []
    for label, result in results.items():
        chosen = steps_of(result.traces)[-1] if step is None else step
        for rank, numbers in exposure(result.traces, chosen).items():
            rows.append(
                [
                    label,
                    rank,
                    f"{numbers['compute'] * 1e3:.1f}",
                    f"{numbers['in_flight'] * 1e3:.1f}",
                    f"{numbers['exposed'] * 1e3:.1f}",
                    f"{numbers['hidden'] * 1e3:.1f}",
                ]
            )
    return table(["run", "rank", "compute ms", "communication in flight ms", "exposed ms", "hidden ms"], rows)


def numbers_table(results: Mapping[str, Any]):
    """Loss per step of each run next to its single-process reference."""
    from launch.html_table import table

    rows = []
    for label, result in results.items():
        losses, reference = result.metrics.get("losses", []), result.metrics.get("reference_losses", [])
        for step, (loss, ref) in enumerate(zip(losses, reference)):
            rows.append([label, step, f"{loss:.8f}", f"{ref:.8f}", f"{abs(loss - ref):.2e}"])
        rows.append(
            [
                label,
                "params",
                "",
                "",
                f"{result.metrics.get('max_param_diff', float('nan')):.2e}"
                + ("" if result.ok else "  ✘ " + ", ".join(result.metrics.get("mismatched_params", []))),
            ]
        )
    return table(
        ["run", "step", "loss", "single-process reference", "|difference|"],
        rows,
        caption="every step against the reference; 'params': max |param - reference| after the last step",
    )


def expect_invalid(recipe: str, **degrees: int) -> str:
    """The rule's message for an invalid run (``launch.validate``); AssertionError if it is valid."""
    from launch.runner import validate

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
