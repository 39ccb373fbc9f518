"""What a user may pass to ``launch.run``, ``python -m launch``, the widgets and ``%%torchrun``: one rule each.

Every entry point calls these before any process starts, so a bad value costs a ``ValueError`` that
names the rule and what to do (the CLI prints it and exits with status 2), never a traceback from deep
inside the library or a worker that fails later. Mesh degrees have their own rules
(``hyper_parallel.mesh``); the recipe's batch rule is checked here in words ``run`` can act on.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from pathlib import Path

RANKS_PER_CORE = 8
"""``%%torchrun -n`` and the pool refuse more ranks than cores x this (each rank is a Python process
importing torch); ``HYPER_PARALLEL_MAX_RANKS`` overrides the cap."""
MAX_RANKS_ENV = "HYPER_PARALLEL_MAX_RANKS"
START_TIMEOUT_ENV = "HYPER_PARALLEL_POOL_START_TIMEOUT"
DEFAULT_START_TIMEOUT = 300.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def timeout(value: object, name: str = "timeout") -> float:
    """Seconds > 0 (``inf``: no limit); refuses 0, negatives, NaN, booleans and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ValueError(
            f"{name} must be a positive number of seconds (or inf for no limit), got {value!r}; pass e.g. {name}=300"
        )
    return float(value)


def start_timeout(value: object | None = None) -> float:
    """The pool's cold-start limit: ``value``, else ``$HYPER_PARALLEL_POOL_START_TIMEOUT``, else 300 s."""
    if value is None:
        raw = os.environ.get(START_TIMEOUT_ENV)
        if raw is None:
            return DEFAULT_START_TIMEOUT
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(
                f"{START_TIMEOUT_ENV}={raw!r} is not a number of seconds; unset it or give e.g. 600"
            ) from None
    return timeout(value, "start_timeout")


def positive_int(value: object, name: str) -> int:
    """An ``int`` >= 1 (not a bool, float or string)."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


def steps(value: object) -> int:
    return positive_int(value, "steps")


def seed(value: object) -> int:
    """Any ``int`` (torch.manual_seed takes negatives too), nothing else."""
    if not _is_int(value):
        raise ValueError(f"seed must be a whole number such as 0, got {value!r}")
    return value


def recipe_name(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"recipe must be a recipe name such as 'M4' (python -m launch list shows them), got {value!r}")
    return value


def out_dir(value: object) -> Path | None:
    """A directory to write a run into: None (a fresh scratch one), or a path that is a directory or absent."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"out must be a directory path, got {value!r}")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out={str(path)!r} exists and is not a directory; give a folder (it is created if absent)")
    return path


def max_ranks() -> int:
    """How many ranks this machine may start at once: cores x ``RANKS_PER_CORE`` unless overridden."""
    raw = os.environ.get(MAX_RANKS_ENV)
    if raw is not None:
        try:
            return positive_int(int(raw), MAX_RANKS_ENV)
        except ValueError:
            raise ValueError(f"{MAX_RANKS_ENV}={raw!r} must be a whole number >= 1") from None
    return (os.cpu_count() or 1) * RANKS_PER_CORE


def rank_count(value: object, name: str = "-n") -> int:
    """A number of local ranks: >= 1 and within ``max_ranks()``."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be at least 1 rank, got {value!r}")
    cap = max_ranks()
    if value > cap:
        raise ValueError(
            f"{name} {value} is more ranks than this machine can run ({os.cpu_count()} cores x {RANKS_PER_CORE} = "
            f"{cap}: each rank is a Python process importing torch); use fewer, or set {MAX_RANKS_ENV}={value} "
            f"to allow it"
        )
    return value


def identifier(value: str, name: str) -> str:
    """A Python name (for a kernel variable)."""
    if not value.isidentifier():
        raise ValueError(f"{name} must be a Python variable name such as 'values', got {value!r}")
    return value


def json_names(value: object, where: str) -> None:
    """Data that JSON carries unchanged: dict keys must be strings (JSON turns ``{1: 'a'}`` into ``{'1': 'a'}``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(
                    f"{where}: dict key {key!r} is not a string and would arrive as {str(key)!r}; "
                    f"use string keys or send a list of pairs"
                )
            json_names(item, where)
    elif isinstance(value, (list, tuple)):
        for item in value:
            json_names(item, where)


def launch_target(target: str) -> list[str]:
    """``[SCRIPT]`` or ``["-m", MODULE]``; ``ValueError`` for a target that is neither."""
    if not isinstance(target, str):
        raise ValueError(f"target must be a .py path or a module name (a string), got {target!r}")
    if target.endswith(".py") or os.path.isfile(target):
        script = Path(target).expanduser().resolve()
        if not script.is_file():
            raise ValueError(
                f"script {target!r} not found (looked for {script}); pass an existing .py file or a module name"
            )
        entry = [str(script)]
    elif target and all(part.isidentifier() for part in target.split(".")):
        entry = ["-m", target]
    else:
        raise ValueError(f"target {target!r} is neither an existing file nor a dotted module name such as 'pkg.train'")
    return entry


SCALED_MM_PROBE = "from hyper_parallel.parallel.float8 import require_scaled_mm; require_scaled_mm()"
"""What a float8 recipe needs of this torch build, run in a child process (the launcher's own process never
imports torch): ``torch._scaled_mm`` on a 16 x 16 float8 product."""


@functools.cache
def float8_kernel(probe: str = SCALED_MM_PROBE) -> None:
    """Refuse a float8 recipe on a torch build without a working ``torch._scaled_mm`` (the probe's error)."""
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    if child.returncode:
        lines = [line for line in child.stderr.strip().splitlines() if line.strip()]
        reason = lines[-1].split(": ", 1)[-1] if lines else f"the probe exited with {child.returncode}"
        raise ValueError(reason)
