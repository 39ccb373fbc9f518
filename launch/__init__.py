"""Run workers from Python, the CLI or a widget: torchrun on loopback, logs, timeouts, results.

launch.torchrun(target, nproc, ...)   any script or module on N local ranks
launch.run(recipe, **degrees)         a recipe against its single-process reference (warm pool)
launch.run_many([{...}, ...])         several runs of one world size in one process group
launch.shutdown_pool()                end the warm workers (``launch.processes.pool``)
launch.write_report(run_dir)          a self-contained HTML report of a run directory
%load_ext launch                      ``%%torchrun -n 4``: a notebook cell on 4 ranks (``launch.notebook.magic``)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launch.processes.pool import Pool, shutdown_pool
    from launch.processes.supervisor import TorchrunResult, torchrun
    from launch.report import write_report
    from launch.runs import RunResult, run, run_many, validate

_HOMES = {
    "run": "launch.runs",
    "run_many": "launch.runs",
    "validate": "launch.runs",
    "RunResult": "launch.runs",
    "torchrun": "launch.processes.supervisor",
    "TorchrunResult": "launch.processes.supervisor",
    "write_report": "launch.report",
    "Pool": "launch.processes.pool",
    "shutdown_pool": "launch.processes.pool",
}
"""Where each name lives, imported on first use: a pool worker or the torchrun agent is a module of this
package, and importing the launcher's API with it (reports, matplotlib, the pool) cost every rank 0.5 s."""


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'launch' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "run",
    "run_many",
    "validate",
    "RunResult",
    "torchrun",
    "TorchrunResult",
    "write_report",
    "Pool",
    "shutdown_pool",
    "load_ipython_extension",
]


def load_ipython_extension(ipython) -> None:
    """``%load_ext launch``: registers ``%%torchrun``."""
    from launch.notebook.magic import load_ipython_extension as register

    register(ipython)
