"""Run workers from Python, the CLI or a widget: torchrun on loopback, logs, timeouts, results.

    launch.torchrun(target, nproc, ...)   any script or module on N local ranks
    launch.run(recipe, **degrees)         a recipe against its single-process reference
"""
from launch.runner import RunResult, run, validate
from launch.torchrun import TorchrunResult, torchrun

__all__ = ["run", "validate", "RunResult", "torchrun", "TorchrunResult"]
