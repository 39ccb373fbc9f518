"""The workbook: run the notebooks headless (``make workbook``) in reading order.

    python -m launch workbook --out runs      every notebook in notebooks/ through papermill into
                                              runs/<timestamp>/: executed .ipynb, figures/, run data,
                                              a report.html in every run directory; --jobs 2 (default)
                                              runs two notebooks at a time (each worker keeps one
                                              kernel and warm pool, reset between its notebooks)

The helpers the notebooks call (so their cells stay one call each) live in ``launch.notebook.runs``
(running recipes, figures, invalid meshes, the CLI) and ``launch.notebook.tables`` (result tables), where
the notebooks import them from:

    run_recipes({"M4": m4, "M7": m7}, steps=2, out=runs_dir)   one torchrun launch per world size
    figures(result, figures_dir)          the figures of a run, each drawn (and saved as PNG) when shown
    show_figures(result, figures_dir)     the same, displayed with a heading each
    groupinfo_table(results)              per fully_shard unit: shard/dp/rank sizes, RS and AR groups
    collective_table(results)             collectives of the last step per (op, group)
    numbers_table(results)                loss per step against the single-process reference
    expect_invalid(recipe, **degrees)     the ValueError message of an invalid mesh (fails if it is valid)
    cli("check", "--world", "3", ...)     ``python -m launch ...`` in a subprocess: exit code and output
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyper_parallel.run_files import NO_SPACE, no_space
from launch import inputs
from launch.notebook.workbook_kernel import KERNEL_ARGUMENTS, WorkbookKernel
from launch.processes.run_dirs import make_run_dir

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"  # launch/notebook/workbook.py
FIGURE_PARAMETER, RUNS_PARAMETER = "figures_dir", "runs_dir"


READING_ORDER = (
    "00_start_here",
    "00b_collectives",
    "01_ddp_fsdp",
    "02_memory",
    "03_tensor_sequence_parallel",
    "04_context_parallel",
    "05_hsdp",
    "06_mesh_algebra",
    "07_fully_shard_groupinfo",
    "08_moe_expert_parallel",
    "09_pipeline_parallel",
    "10_pure_tp_fix",
    "11_planning_at_scale",
    "12_your_own_model",
    "90_negative_cases",
    "91_performance",
    "92_recipe_matrix",
)
"""The learning path, which the file names follow: concepts before mechanics (00b, what a collective costs,
slotted in after 00 without renumbering the rest), each notebook after every one
it builds on (05's second run stacks 04's CP under HSDP; 08's dual-stack meshes need 06's efsdp and 07's
GroupInfo; pipelines, 09, once the mesh of 06 is known), the appendix last (90-92). 00 and every
notebook's "Next:" link give this order; an exercise's id starts with its notebook's number ("05.2")."""


SOLO = ("91_performance",)
"""Notebooks that time things: they run alone, after the others, so that no other notebook's load skews
their ratios."""


def notebooks(folder: str | Path = NOTEBOOKS_DIR) -> list[Path]:
    """The workbook's notebooks in reading order (``READING_ORDER``, the order of their names; any other
    notebook after them, by name)."""
    found = sorted(p for p in Path(folder).glob("*.ipynb") if not p.name.startswith("."))
    rank = {name: i for i, name in enumerate(READING_ORDER)}
    return sorted(found, key=lambda p: (rank.get(p.stem, len(rank)), p.name))


def execute_notebook(
    path: str | Path,
    output: str | Path,
    parameters: Mapping[str, Any] | None = None,
    timeout: float = 900.0,
    kernel: WorkbookKernel | None = None,
) -> tuple[bool, str]:
    """Run one notebook with papermill (cwd: its folder); returns (ok, error summary or "").

    Without ``kernel`` the notebook gets a kernel of its own, as a learner's *Run All*; with one, it runs
    in that kernel after the notebooks before it, started afresh (``launch.notebook.workbook_kernel``)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    path, output = Path(path), Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if kernel is not None:
        kernel.prepare(path.parent)
    ok, error = True, ""
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
            extra_arguments=KERNEL_ARGUMENTS,
            **({"km": kernel.manager} if kernel is not None else {}),
        )
    except PapermillExecutionError as failure:
        ok = False
        error = f"cell {failure.exec_count}: {failure.ename}: {str(failure.evalue).splitlines()[0] if failure.evalue else ''}"
    except Exception as failure:  # kernel died, timeout, bad notebook
        ok = False
        error = f"{type(failure).__name__}: {str(failure).strip().splitlines()[0] if str(failure).strip() else ''}"
    if kernel is not None:
        kernel.finished(ok)
    return ok, error


@dataclass(frozen=True)
class NotebookOutcome:
    """One executed notebook: whether it ran through, its time, and what it left in the workbook."""

    name: str
    ok: bool
    error: str
    seconds: float
    figures: int
    reports: list[Path] = field(default_factory=list)
    report_problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        status = "OK    " if self.ok else "FAILED"
        return (
            f"{status} {self.name:<30} {self.seconds:6.1f}s  {self.figures:3d} figures  {len(self.reports):2d} reports"
            + (f"  {self.error}" if self.error else "")
        )


def run_notebook(path: Path, root: Path, extra: Mapping[str, Any], kernel: WorkbookKernel) -> NotebookOutcome:
    """Execute one notebook into ``root`` (its figures and runs under ``root/figures|runs/<name>``) in
    ``kernel``, and write a report for each of its runs."""
    from launch.report import write_reports

    params = {
        FIGURE_PARAMETER: str(root / "figures" / path.stem),
        RUNS_PARAMETER: str(root / "runs" / path.stem),
        **dict(extra),
    }
    began = time.monotonic()
    ok, error = execute_notebook(path, root / path.name, params, kernel=kernel)
    pngs = len(list((root / "figures" / path.stem).rglob("*.png")))
    # one report.html per run directory, embedding the figures the notebook already saved of that run
    written, problems = write_reports(root / "runs" / path.stem, shown=root / "figures" / path.stem)
    return NotebookOutcome(path.stem, ok, error, time.monotonic() - began, pngs, written, problems)


def _jobs(value: object) -> int:
    """Notebooks at a time: 1 .. the cores (at least 2): each runs a kernel and its ranks."""
    jobs = inputs.positive_int(value, "--jobs")
    cap = max(2, os.cpu_count() or 1)
    if jobs > cap:
        raise ValueError(
            f"--jobs {jobs} is more notebooks at a time than this machine's {os.cpu_count()} cores run "
            f"(each starts a kernel and its ranks); use at most {cap}"
        )
    return jobs


def _fresh_workbook_dir(out: Path) -> Path:
    """``out/<timestamp>``, or ``<timestamp>-2``, ``-3``...: a folder no other workbook started in the same
    second writes into (each is created exclusively)."""
    parent = make_run_dir(out)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for attempt in itertools.count(1):
        root = parent / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            root.mkdir(mode=0o755)
        except FileExistsError:
            continue
        except OSError as error:
            if error.errno in NO_SPACE:
                raise no_space(parent, error) from None
            raise ValueError(
                f"cannot create the workbook folder {root}: {error.strerror}; choose another --out"
            ) from None
        return root.resolve()
    raise AssertionError("itertools.count() does not end")


def run_workbook(
    out: str | Path,
    only: Iterable[str] | None = None,
    parameters: Mapping[str, Mapping] | None = None,
    notebooks_dir: str | Path = NOTEBOOKS_DIR,
    jobs: int = 1,
) -> int:
    """Execute every notebook into ``out/<timestamp>/``; print one status line per notebook; 1 if any failed.

    ``jobs`` > 1 runs that many notebooks at a time in worker processes, each keeping one kernel (and so
    one warm pool) for its notebooks, started afresh for each (``WorkbookKernel``; with ``jobs`` 1 the
    same in this process); ``SOLO`` notebooks run last, alone; lines are printed in reading order.

    Each notebook gets ``figures_dir=<root>/figures/<notebook>`` and ``runs_dir=<root>/runs/<notebook>``;
    ``only`` restricts to notebooks whose name starts with one of the given prefixes; ``parameters``
    maps a notebook name (stem) to extra papermill parameters.
    """
    jobs = _jobs(jobs)
    out = inputs.out_dir(out)
    if out is None:
        raise ValueError("out must be a folder for the workbook (e.g. runs)")
    only = list(only) if only is not None else None
    root = _fresh_workbook_dir(out)
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
    jobs = min(jobs, len(chosen))
    solo = [p for p in chosen if p.stem in SOLO]
    shared = [p for p in chosen if p.stem not in SOLO]
    how = ""
    if jobs > 1:
        how = f", {jobs} at a time" + (f" ({', '.join(p.stem for p in solo)} alone, last)" if solo else "")
    print(f"running {len(chosen)} notebooks into {root}{how}", flush=True)
    start, outcomes = time.monotonic(), []
    extra = {path.stem: dict((parameters or {}).get(path.stem, {})) for path in chosen}
    if jobs == 1:
        with WorkbookKernel() as kernel:
            for path in chosen:
                outcomes.append(run_notebook(path, root, extra[path.stem], kernel))
                _report_outcome(outcomes[-1])
    else:
        outcomes = _run_in_workers(shared, solo, root, extra, jobs)
    failed = [outcome.name for outcome in outcomes if not outcome.ok]
    reports = [report for outcome in outcomes for report in outcome.reports]
    total = time.monotonic() - start
    print(f"workbook written to {root} ({len(chosen)} notebooks, {len(failed)} failed, {total:.0f}s)")
    print(
        f"  executed notebooks: {root}/*.ipynb\n  figures (PNG, the ones each notebook shows): {root}/figures/<notebook>/<run>/"
        f"\n  run data (metrics, traces, Chrome traces): {root}/runs/<notebook>/<run>/"
    )
    print(f"  reports (self-contained HTML, one per run): {len(reports)}")
    for report in reports:
        print(f"    {report.relative_to(root)}")
    if failed:
        print("failed: " + ", ".join(failed) + " (open the executed notebook to see the failing cell)")
    return 1 if failed else 0


def _serve(tasks: multiprocessing.SimpleQueue, done: multiprocessing.SimpleQueue, root: Path, extra: dict) -> None:
    """A worker process of ``run_workbook``: notebooks from ``tasks`` (None: stop), one kernel for all.
    A terminal's Ctrl-C is for the parent, which ends the workers (``terminate``); a kernel whose worker is
    gone ends itself (ipykernel watches its parent), and its warm pool with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with WorkbookKernel() as kernel:
        for index, path in iter(tasks.get, None):
            done.put((index, run_notebook(path, root, extra[path.stem], kernel)))


def _run_in_workers(shared: list[Path], solo: list[Path], root: Path, extra: dict, jobs: int) -> list[NotebookOutcome]:
    """``shared`` notebooks ``jobs`` at a time, each worker taking the next one when it is done, then the
    ``solo`` ones alone; each line is printed once it and every one before it in reading order are done.

    The solo notebooks' kernel and its warm pool start while the last shared notebook runs (a core is
    free by then: ``_SoloKernel``), so the timed notebook pays neither start and runs once the others ended."""
    context = multiprocessing.get_context("spawn")
    tasks, done = context.SimpleQueue(), context.SimpleQueue()
    workers = [context.Process(target=_serve, args=(tasks, done, root, extra)) for _ in range(jobs)]
    outcomes: dict[int, NotebookOutcome] = {}
    with _SoloKernel(solo) as solo_kernel:
        try:
            for worker in workers:
                worker.start()
            for index, path in enumerate(shared):
                tasks.put((index, path))
            for _ in workers:
                tasks.put(None)  # each worker ends, its kernel and warm pool with it, once the queue is empty
            printed = 0
            while printed < len(shared):
                if len(shared) - len(outcomes) < jobs:  # every notebook left is running: a worker is idle
                    solo_kernel.start_warming()
                while done.empty():
                    ended = [worker.exitcode for worker in workers if worker.exitcode is not None]
                    if (any(ended) or len(ended) == len(workers)) and done.empty():
                        raise RuntimeError("a workbook worker process ended without finishing its notebook")
                    time.sleep(0.1)
                index, outcome = done.get()
                outcomes[index] = outcome
                while printed in outcomes:
                    _report_outcome(outcomes[printed])
                    printed += 1
            for worker in workers:
                worker.join()
            kernel = solo_kernel.ready()
            for index, path in enumerate(solo, len(shared)):  # alone: no other kernel, pool or agent is up
                outcomes[index] = run_notebook(path, root, extra[path.stem], kernel)
                _report_outcome(outcomes[index])
        finally:  # Ctrl-C or a broken worker: stop the running notebooks (their kernels follow), start no other
            for worker in workers:
                if worker.is_alive():
                    worker.terminate()
            for worker in workers:
                worker.join(timeout=10)
                if worker.is_alive():
                    worker.kill()
                    worker.join()
    return [outcomes[index] for index in sorted(outcomes)]


WARM_JOIN_SECONDS = 30.0
"""How long an interrupted workbook waits for the solo kernel's warm-up to notice its kernel is gone (a kernel
left behind still ends with this process: ipykernel watches its parent)."""


class _SoloKernel:
    """The kernel of the solo notebooks, started with its pool in a thread (``start_warming``) before they
    run; a failed warm-up is only slower: the first notebook then starts what is missing itself."""

    def __init__(self, solo: list[Path]) -> None:
        self.kernel = WorkbookKernel()
        self._folder = solo[0].parent if solo else None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _SoloKernel:
        return self

    def __exit__(self, *exc_info) -> None:
        """End the kernel, also one a warm-up still under way (on Ctrl-C) starts after the first close."""
        self.kernel.close()
        if self._thread is not None:
            self._thread.join(timeout=WARM_JOIN_SECONDS)
            self.kernel.close()

    def start_warming(self) -> None:
        if self._thread is None and self._folder is not None:
            self._thread = threading.Thread(target=self._warm, name="warm-solo-kernel", daemon=True)
            self._thread.start()

    def _warm(self) -> None:
        with contextlib.suppress(Exception):  # a kernel or pool that did not start is started by the notebook
            self.kernel.warm(self._folder)

    def ready(self) -> WorkbookKernel:
        """The kernel, once its warm-up (if any began) is over."""
        if self._thread is not None:
            self._thread.join()
        return self.kernel


def _report_outcome(outcome: NotebookOutcome) -> None:
    print(outcome.line(), flush=True)
    for problem in outcome.report_problems:
        print(f"       no report for {problem}", flush=True)
