"""``launch.run``: validate a recipe's degrees in this process, run its workers, collect the results.

Validation happens before any process starts, so a bad mesh costs milliseconds and a clear
``ValueError``, not a crashed torchrun. The workers write ``metrics.json`` (rank 0) and one trace
per rank into the run directory; the result object carries both.
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes import registry
from hyper_parallel.run_files import METRICS_FILE, PROGRESS_PREFIX, SUMMARY_FILE, TRACE_FILE, load_json, load_traces
from launch.torchrun import TorchrunResult, torchrun

WORKER_MODULE = "hyper_parallel.recipes.worker"


@dataclass
class RunResult:
    recipe: str
    dims: ParallelDims
    process: TorchrunResult
    metrics: dict[str, Any] = field(default_factory=dict)
    traces: dict[int, list[dict]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Workers exited cleanly and the run matched its single-process reference."""
        return self.process.ok and bool(self.metrics.get("ok"))

    @property
    def run_dir(self) -> Path:
        return self.process.run_dir

    @property
    def logs(self) -> dict[int, list[str]]:
        return self.process.logs

    @property
    def error(self) -> str | None:
        if not self.process.ok:
            return self.process.error
        if not self.metrics:
            return f"the workers wrote no {METRICS_FILE} into {self.run_dir}"
        if not self.metrics.get("ok"):
            return (f"result differs from the single-process reference: max |loss diff| = "
                    f"{self.metrics.get('max_abs_diff')}, parameters off: {self.metrics.get('mismatched_params')}")
        return None

    def summary(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe, "degrees": self.dims.degrees(), "ok": self.ok,
            "losses": self.metrics.get("losses", []), "reference_losses": self.metrics.get("reference_losses", []),
            "max_abs_diff": self.metrics.get("max_abs_diff"), "max_param_diff": self.metrics.get("max_param_diff"),
            "step_times": self.metrics.get("step_times", []), "returncode": self.process.returncode,
            "duration": self.process.duration, "error": self.error,
        }

    def save_summary(self) -> Path:
        path = self.run_dir / SUMMARY_FILE
        path.write_text(json.dumps(self.summary(), indent=1))
        return path


def resolve_degrees(recipe: registry.Recipe, given: dict[str, int | None]) -> dict[str, int]:
    """The degrees of a run: the recipe's defaults when none are given; otherwise the given ones, with
    world_size the product of the dense degrees when dp_shard is given, else the recipe's world_size."""
    degrees = {k: v for k, v in given.items() if v is not None}
    if not degrees:
        return dict(recipe.default)
    if "world_size" not in degrees:
        if degrees.get("dp_shard", -1) != -1:
            world = 1
            for name in ("dp_replicate", "dp_shard", "cp", "tp", "pp"):
                world *= degrees.get(name, 1)
            degrees["world_size"] = world
        else:
            degrees["world_size"] = recipe.default["world_size"]
    return degrees


def validate(recipe: str, **degrees: int | None) -> tuple[registry.Recipe, ParallelDims]:
    """The recipe and its ParallelDims, or ``ValueError`` (unknown recipe, invalid mesh, bad shapes)."""
    spec = registry.get(recipe)
    return spec, spec.validate(**resolve_degrees(spec, degrees))


def run(recipe: str, *, steps: int | None = None, timeout: float = 300.0, out: str | Path | None = None,
        seed: int = 0, on_line: Callable[[int, str], None] | None = None,
        on_progress: Callable[[dict], None] | None = None, **degrees: int | None) -> RunResult:
    """Run ``recipe`` on ``torchrun`` workers and compare with its single-process reference.

    ``degrees``: world_size, dp_replicate, dp_shard, cp, tp, ep, etp (pp must stay 1). Raises
    ``ValueError`` before any worker starts when they are invalid.
    """
    spec, dims = validate(recipe, **degrees)
    steps = spec.steps if steps is None else steps
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    run_dir = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix=f"hp-{spec.name}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in [run_dir / METRICS_FILE, run_dir / SUMMARY_FILE, *run_dir.glob(TRACE_FILE.format(rank="*"))]:
        stale.unlink(missing_ok=True)
    explicit = {k: v for k, v in dims.degrees().items() if k != "world_size"}

    def forward_line(rank: int, line: str) -> None:
        if rank == 0 and line.startswith(PROGRESS_PREFIX) and on_progress is not None:
            on_progress(json.loads(line[len(PROGRESS_PREFIX):]))
        if on_line is not None:
            on_line(rank, line)

    args = ["--recipe", spec.name, "--degrees", json.dumps(explicit), "--steps", str(steps), "--seed", str(seed),
            "--out", str(run_dir), "--collective-timeout", str(max(30.0, timeout))]
    started = time.perf_counter()
    process = torchrun(WORKER_MODULE, dims.world_size, args=args, timeout=timeout, on_line=forward_line,
                       run_dir=run_dir)
    result = RunResult(spec.name, dims, process, load_json(run_dir / METRICS_FILE), load_traces(run_dir))
    result.metrics.setdefault("wall_time", time.perf_counter() - started)
    result.save_summary()
    return result
