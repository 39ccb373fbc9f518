"""``launch.run``: validate a recipe's degrees in this process, run its workers, collect the results.

Validation happens before any process starts, so a bad mesh costs milliseconds and a clear
``ValueError``, not a crashed torchrun. The workers write ``metrics.json`` (rank 0) and one trace
per rank into the run directory; the result object carries both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyper_parallel.link import Link, parse_link
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes import registry
from hyper_parallel.recipes.options import OPTION_NAMES
from hyper_parallel.recipes.run_spec import WORKER_MODULE, RunSpec
from hyper_parallel.run_files import (
    BATCH_FILE,
    EXIT_MISMATCH,
    METRICS_FILE,
    PROGRESS_PREFIX,
    SUMMARY_FILE,
    disk_full_named,
    load_json,
    load_traces,
    names_no_space,
    write_atomic,
)
from launch import inputs
from launch.processes.run_dirs import begin_run, claimed, finish_run, make_run_dir, new_scratch_dir
from launch.processes.supervisor import TorchrunResult, torchrun_claimed


@dataclass
class RunResult:
    recipe: str
    dims: ParallelDims
    process: TorchrunResult
    metrics: dict[str, Any] = field(default_factory=dict)
    traces: dict[int, list[dict]] = field(default_factory=dict)
    directory: Path | None = None  # this run's own folder (a launch of several runs shares process.run_dir)

    @property
    def ok(self) -> bool:
        """Workers exited cleanly and the run matched its single-process reference."""
        return self.process.ok and bool(self.metrics.get("ok"))

    @property
    def run_dir(self) -> Path:
        return self.directory if self.directory is not None else self.process.run_dir

    @property
    def logs(self) -> dict[int, list[str]]:
        return self.process.logs

    @property
    def out_of_space(self) -> bool:
        """The run failed because a disk was full (a rank could not write its results)."""
        return not self.process.ok and names_no_space(self.process.error or "")

    @property
    def error(self) -> str | None:
        if self.out_of_space:
            return f"no space left in {self.run_dir}: the ranks could not write their results\n{self.process.error}"
        if not self.process.ok and not (self.process.returncode == EXIT_MISMATCH and self.metrics):
            return self.process.error
        if not self.metrics:
            return f"the workers wrote no {METRICS_FILE} into {self.run_dir}"
        if not self.metrics.get("ok"):
            return (
                f"result differs from the single-process reference: max |loss diff| = "
                f"{self.metrics.get('max_abs_diff')}, parameters off: {self.metrics.get('mismatched_params')}"
            )
        return None

    def summary(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "degrees": self.dims.degrees(),
            "options": self.metrics.get("options", {}),
            "adapted": self.metrics.get("adapted", []),
            "ok": self.ok,
            "losses": self.metrics.get("losses", []),
            "reference_losses": self.metrics.get("reference_losses", []),
            "max_abs_diff": self.metrics.get("max_abs_diff"),
            "max_param_diff": self.metrics.get("max_param_diff"),
            "step_times": self.metrics.get("step_times", []),
            "returncode": self.process.returncode,
            "duration": self.process.duration,
            "error": self.error,
        }

    def save_summary(self) -> Path:
        """Write summary.json, the launcher's verdict; the run's folder is complete from then on."""
        path = write_atomic(self.run_dir / SUMMARY_FILE, json.dumps(self.summary(), indent=1))
        finish_run(self.run_dir)
        return path

    def __repr__(self) -> str:
        """Status, recipe, degrees, numerics, run directory: what a notebook cell should show (the metrics,
        traces and logs are fields to read, not to print)."""
        if self.ok:
            numbers = (
                f"max |loss - ref| {self.metrics.get('max_abs_diff'):.3g}, "
                f"max |param - ref| {self.metrics.get('max_param_diff'):.3g}"
            )
        else:
            numbers = "FAILED: " + ((self.error or "").strip().splitlines() or [""])[-1][:200]
        return (
            f"RunResult({self.recipe}, {self.dims.label(world=True)}, {len(self.metrics.get('losses', []))} steps, {numbers}, "
            f"{self.process.duration:.1f} s, {self.run_dir})"
        )

    def _repr_html_(self) -> str:
        summary = self.summary()
        color = "#2e7d32" if self.ok else "#c62828"
        rows = [
            ("status", "matches the single-process reference" if self.ok else "FAILED"),
            ("degrees", self.dims.label(world=True)),
            ("options", "; ".join([", ".join(f"{k}={v}" for k, v in summary["options"].items()), *summary["adapted"]])),
            ("losses", ", ".join(f"{x:.6f}" for x in summary["losses"])),
            ("reference", ", ".join(f"{x:.6f}" for x in summary["reference_losses"])),
            (
                "max |loss - ref| / |param - ref|",
                f"{_short(summary['max_abs_diff'])} / {_short(summary['max_param_diff'])}",
            ),
            ("wall time", f"{summary['duration']:.1f} s"),
            ("run directory", str(self.run_dir)),
        ]
        if not self.ok:
            rows.append(("error", summary["error"] or ""))
        body = "".join(
            f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
            f"<td style='text-align:left;white-space:pre-wrap'>{html.escape(str(v))}</td></tr>"
            for k, v in rows
        )
        return (
            f"<div><b style='color:{color}'>{'PASSED' if self.ok else 'FAILED'}</b> "
            f"<b>{html.escape(self.recipe)}</b><table>{body}</table></div>"
        )


def _short(value: float | None) -> str:
    """A difference as 3 significant digits (the full float repr hides its magnitude); '-' when absent."""
    return "-" if value is None else f"{value:.3g}"


def resolve_run(
    recipe: str,
    *,
    steps: int | None = None,
    seed: int = 0,
    overlap: bool | None = None,
    reshard_after_forward: bool | None = None,
    out: str | Path | None = None,
    link: Link | str | None = None,
    **given: int | None,
) -> RunSpec:
    """One run as the record every launch path passes to the worker (``given``: degrees and options by
    name; the options resolved here, once), or ``ValueError`` (unknown recipe, invalid mesh, an option
    that does not fit the mesh, a bad steps / seed / overlap / reshard_after_forward / out / link)."""
    for name, value in given.items():
        inputs.whole_number(value, name)
    options = {name: given.pop(name) for name in OPTION_NAMES if name in given}
    row = registry.get(inputs.recipe_name(recipe))
    if overlap is None:
        inputs.overlap_env()
    if overlap not in (None, True, False):
        raise ValueError(f"overlap must be True, False or None (HYPER_PARALLEL_OVERLAP decides), got {overlap!r}")
    if row.shapes.get("float8_dims"):
        inputs.float8_kernel(inputs.SCALED_MM_PROBE)
    if reshard_after_forward not in (None, True, False):
        raise ValueError(
            f"reshard_after_forward must be True, False or None (the recipe decides), got {reshard_after_forward!r}"
        )
    return RunSpec.resolve(
        row.name,
        row.resolve_degrees(given),
        options,
        steps=None if steps is None else inputs.steps(steps),
        seed=inputs.seed(seed),
        overlap=overlap,
        reshard_after_forward=reshard_after_forward,
        out=inputs.out_dir(out),
        link=parse_link(link),
    )


def validate(recipe: str, **given: int | None) -> tuple[registry.Recipe, ParallelDims]:
    """The recipe and its ParallelDims, or ``ValueError`` (unknown recipe, invalid mesh, bad options:
    ``given`` holds degrees and, by name, the options of ``run``)."""
    spec = resolve_run(recipe, **given)
    return registry.get(spec.recipe), spec.dims


def run(
    recipe: str,
    *,
    steps: int | None = None,
    timeout: float = 300.0,
    out: str | Path | None = None,
    seed: int = 0,
    overlap: bool | None = None,
    reshard_after_forward: bool | None = None,
    link: Link | str | None = None,
    on_line: Callable[[int, str], None] | None = None,
    on_progress: Callable[[dict], None] | None = None,
    pool: bool = True,
    **given: int | None,
) -> RunResult:
    """Run ``recipe`` on ``torchrun`` workers and compare with its single-process reference.

    ``given``: the degrees (world_size, dp_replicate, dp_shard, cp, tp, pp (pipeline recipes only), ep,
    etp) and the recipe's options (those its model has, ``python -m launch list`` / docs/recipes.md):
    ``global_batch``, ``seq_len``, ``num_experts`` and, for pipeline recipes, ``microbatches``. Left out,
    an option takes the recipe's default, or the nearest value that fits the mesh when the default does
    not (``result.metrics["adapted"]`` says which); a value given that does not fit raises ``ValueError``
    with the values that do.

    ``overlap=False`` issues every fully_shard collective synchronously (no prefetch, no reduce-scatter
    in flight): the same numbers, a timeline without overlap; None follows ``HYPER_PARALLEL_OVERLAP``
    (on unless it is 0). ``reshard_after_forward=True`` makes every fully_shard unit below another
    reshard after forward (fewer bytes held gathered, more all-gathers: under PP, where the recipes keep
    units gathered, one per microbatch), ``False`` none; None leaves the recipe's choice. ``link``
    emulates a slow link (``hyper_parallel.link``): a ``Link(latency_s, bytes_per_s)``, a preset name
    ("notebook", "slow", "lan") or text such as "2ms,1MB/s"; every traced collective then completes no
    earlier than latency + wire bytes / rate after it is issued (the workers sleep meanwhile; the numbers
    are unchanged). Raises ``ValueError`` before any worker starts when anything is invalid.
    """
    spec = resolve_run(
        recipe,
        steps=steps,
        seed=seed,
        overlap=overlap,
        reshard_after_forward=reshard_after_forward,
        out=out,
        link=link,
        **given,
    )
    return run_spec(spec, timeout=timeout, on_line=on_line, on_progress=on_progress, pool=pool)


def run_spec(
    spec: RunSpec,
    *,
    timeout: float = 300.0,
    on_line: Callable[[int, str], None] | None = None,
    on_progress: Callable[[dict], None] | None = None,
    pool: bool = True,
) -> RunResult:
    """``run`` of a resolved record (``resolve_run``): its files in ``spec.out`` (a new scratch folder when None)."""
    return run_many([spec], timeout=timeout, out=spec.out, on_line=on_line, on_progress=on_progress, pool=pool)[0]


def run_many(
    runs: Sequence[RunSpec | Mapping[str, Any]],
    *,
    timeout: float = 600.0,
    out: str | Path | None = None,
    on_line: Callable[[int, str], None] | None = None,
    on_progress: Callable[[dict], None] | None = None,
    pool: bool = True,
) -> list[RunResult]:
    """Several recipe runs of the same world size in ONE process group, one after another.

    Each run is a ``RunSpec`` (``resolve_run``) or the keywords of ``resolve_run`` as a dict,
    ``{"recipe": ..., "steps": ..., "seed": ..., "overlap": None, "link": None, **degrees, **options}`` (the options of
    ``run``, e.g. ``"microbatches": 2``), and writes into its ``out`` (``out/NN-RECIPE`` when it has
    none). All runs are validated before anything starts. ``pool=True`` (default) runs them on this
    process's warm workers (``launch.processes.pool``: started on first use, grown to the largest world
    size asked for; a fresh process group, reseeded RNGs and a fresh trace per run); ``pool=False`` starts
    a torchrun launch for them and ends it after.
    """
    if isinstance(runs, (str, bytes, Mapping)) or not isinstance(runs, Sequence):
        raise ValueError(f"runs must be a list of runs (RunSpec or dicts of launch.run's keywords), got {runs!r}")
    if not runs:
        raise ValueError("run_many needs at least one run")
    timeout = inputs.timeout(timeout)
    out = inputs.out_dir(out)
    inputs.callback(on_line, "on_line")
    inputs.callback(on_progress, "on_progress")
    if inputs.flag(pool, "pool"):
        inputs.start_timeout()  # the pool's cold-start limit: refused before any folder is made
    specs = [run if isinstance(run, RunSpec) else _resolve_mapping(run) for run in runs]
    for spec in specs:
        inputs.rank_count(spec.dims.world_size, "world_size")  # every rank is a local process
    worlds = {spec.dims.world_size for spec in specs}
    if len(worlds) != 1:
        raise ValueError(f"runs of one launch must share a world size; got {sorted(worlds)}")
    _check_distinct_outs(specs)
    with disk_full_named(out or "the scratch folder"):
        return _run_batch(specs, out, timeout, on_line, on_progress, pool)


def _run_batch(
    specs: list[RunSpec],
    out: Path | None,
    timeout: float,
    on_line: Callable[[int, str], None] | None,
    on_progress: Callable[[dict], None] | None,
    pool: bool,
) -> list[RunResult]:
    """Make and claim the folders, launch the validated runs, write each run's summary."""
    root = make_run_dir(out) if out is not None else new_scratch_dir("hp-run-")
    specs = [
        dataclasses.replace(spec, out=make_run_dir(spec.out or root / f"{index:02d}-{spec.recipe}"))
        for index, spec in enumerate(specs)
    ]
    with contextlib.ExitStack() as claims:
        folders = list(dict.fromkeys([root, *(spec.out for spec in specs)]))
        for directory in folders:
            claims.enter_context(claimed(directory))  # all of them before anything in one is deleted or written
        for directory in folders:
            begin_run(directory)
        process = _launch_batch(specs, root, timeout, on_line, on_progress, pool)
        results = []
        for spec in specs:
            result = RunResult(
                spec.recipe, spec.dims, process, load_json(spec.out / METRICS_FILE), load_traces(spec.out), spec.out
            )
            result.save_summary()
            results.append(result)
        finish_run(root)
    return results


def _resolve_mapping(run: Mapping[str, Any]) -> RunSpec:
    if not isinstance(run, Mapping):
        raise ValueError(
            f"each run must be a RunSpec or a dict of launch.run's keywords such as {{'recipe': 'M4'}}, got {run!r}"
        )
    given = dict(run)
    return resolve_run(given.pop("recipe", None), **given)


def _check_distinct_outs(specs: list[RunSpec]) -> None:
    """One folder per run: two runs writing into one folder would overwrite each other's results."""
    given = [Path(spec.out).absolute() for spec in specs if spec.out is not None]
    if len(set(given)) != len(given):
        raise ValueError(
            f"each run of a launch needs its own out folder (two runs in one folder overwrite each other's "
            f"results), got {[str(path) for path in given]}"
        )


def _launch_batch(
    specs: list[RunSpec],
    root: Path,
    timeout: float,
    on_line: Callable[[int, str], None] | None,
    on_progress: Callable[[dict], None] | None,
    pool: bool,
) -> TorchrunResult:
    """Write batch.json into the launch's directory, run the batch."""
    batch = [spec.to_json() for spec in specs]
    batch_file = write_atomic(root / BATCH_FILE, json.dumps(batch, indent=1))

    def forward_line(rank: int, line: str) -> None:
        if rank == 0 and line.startswith(PROGRESS_PREFIX) and on_progress is not None:
            on_progress(json.loads(line[len(PROGRESS_PREFIX) :]))
        if on_line is not None:
            on_line(rank, line)

    world_size = specs[0].dims.world_size
    if pool:
        return _run_on_pool(world_size, batch, timeout, forward_line, root)
    args = ["--batch", str(batch_file), "--collective-timeout", str(max(30.0, min(timeout, 3600.0)))]
    return torchrun_claimed(WORKER_MODULE, world_size, args=args, timeout=timeout, on_line=forward_line, run_dir=root)


def _run_on_pool(
    world_size: int, batch: list[dict], timeout: float, on_line: Callable[[int, str], None], run_dir: Path
) -> TorchrunResult:
    """The batch on the warm pool, reported like a launch."""
    from launch.processes.pool import run_as_launch

    return run_as_launch(world_size, {"kind": "recipes", "specs": batch}, timeout, on_line, run_dir)
