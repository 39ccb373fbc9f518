"""Run workers from Python, the CLI or a widget: torchrun on loopback, logs, timeouts, results.

launch.torchrun(target, nproc, ...)   any script or module on N local ranks
launch.run(recipe, **degrees)         a recipe against its single-process reference (warm pool)
launch.run_many([{...}, ...])         several runs of one world size in one process group
launch.shutdown_pool()                end the warm workers (``launch.processes.pool``)
launch.write_report(run_dir)          a self-contained HTML report of a run directory
%load_ext launch                      ``%%torchrun -n 4``: a notebook cell on 4 ranks (``launch.notebook.magic``)
"""

from launch.processes.pool import Pool, shutdown_pool
from launch.processes.supervisor import TorchrunResult, torchrun
from launch.report import write_report
from launch.runs import RunResult, run, run_many, validate

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
