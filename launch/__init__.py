"""Run workers from Python, the CLI or a widget: torchrun on loopback, logs, timeouts, results.

    launch.torchrun(target, nproc, ...)   any script or module on N local ranks
    launch.run(recipe, **degrees)         a recipe against its single-process reference
    launch.run_many([{...}, ...])         several runs of one world size in one launch
    launch.write_report(run_dir)          a self-contained HTML report of a run directory
"""
from launch.report import write_report
from launch.runner import RunResult, run, run_many, validate
from launch.supervisor import TorchrunResult, torchrun

__all__ = ["run", "run_many", "validate", "RunResult", "torchrun", "TorchrunResult", "write_report"]
