"""What a user may pass to ``launch.run``, ``python -m launch``, the widgets and ``%%torchrun``: one rule each.

Every entry point calls these before any process starts, so a bad value costs a ``ValueError`` that
names the rule and what to do (the CLI prints it and exits with status 2), never a traceback from deep
inside the library or a worker that fails later. Mesh degrees have their own rules
(``hyper_parallel.mesh``); the recipe's batch rule is checked here in words ``run`` can act on.
"""

from __future__ import annotations

import argparse
import builtins
import functools
import keyword
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
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


SEED_RANGE = (-(2**63), 2**64 - 1)
"""What ``torch.manual_seed`` accepts (a larger seed fails on every rank, after the workers started)."""


def seed(value: object) -> int:
    """An ``int`` within ``SEED_RANGE`` (torch.manual_seed takes negatives too), nothing else."""
    if not _is_int(value):
        raise ValueError(f"seed must be a whole number such as 0, got {value!r}")
    low, high = SEED_RANGE
    if not low <= value <= high:
        raise ValueError(f"seed must be within torch.manual_seed's range -2**63 .. 2**64-1, got {value}; use e.g. 0")
    return value


def whole_number(value: object, name: str) -> int | None:
    """A degree or option as given (None: not given): an ``int``, not a bool, float or string (its own
    rules, such as dividing the world, are the mesh's and the recipe's)."""
    if value is not None and not _is_int(value):
        raise ValueError(f"{name} must be a whole number such as 2, got {value!r}")
    return value


def callback(value: object, name: str) -> None:
    """None or something to call (``on_line``, ``on_progress``): a bad one would fail inside a running launch."""
    if value is not None and not callable(value):
        raise ValueError(f"{name} must be a function (or None), got {value!r}")


def flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


OVERLAP_ENV = "HYPER_PARALLEL_OVERLAP"


def overlap_env() -> None:
    """``HYPER_PARALLEL_OVERLAP``, read by every rank: unset, 0 (off) or 1 (on); anything else is a typo."""
    raw = os.environ.get(OVERLAP_ENV)
    if raw is not None and raw not in ("0", "1"):
        raise ValueError(f"{OVERLAP_ENV}={raw!r} must be 0 (no overlap) or 1 (overlap); unset it for the default")


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
    try:
        is_file = path.exists() and not path.is_dir()
    except OSError as error:  # a name too long, a loop of links
        raise ValueError(f"out={str(path)[:200]!r} cannot be used as a folder: {error.strerror}") from None
    if is_file:
        raise ValueError(f"out={str(path)!r} exists and is not a directory; give a folder (it is created if absent)")
    return path


def out_file(value: object, name: str = "--out") -> Path:
    """A file to write (a report, a review page): not a folder, in a folder that exists or can be created."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"{name} must be a file path, got {value!r}")
    path = Path(value)
    try:
        if path.is_dir():
            raise ValueError(f"{name} {str(path)!r} is a folder; give a file name such as {path / 'review.html'}")
        parent = next((folder for folder in path.parents if folder.exists()), Path("."))
        if not parent.is_dir():
            raise ValueError(f"{name} {str(path)!r}: {parent} is not a folder")
    except OSError as error:
        raise ValueError(f"{name} {str(path)[:200]!r} cannot be written: {error.strerror}") from None
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


KERNEL_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "display"})
"""Names IPython's kernel keeps for itself: a cell's values stored there would break later cells."""


def identifier(value: str, name: str) -> str:
    """A Python name for a kernel variable: not a keyword, a builtin, IPython's own or a ``_`` name."""
    if not value.isidentifier():
        raise ValueError(f"{name} must be a Python variable name such as 'values', got {value!r}")
    if keyword.iskeyword(value) or hasattr(builtins, value) or value in KERNEL_NAMES or value.startswith("_"):
        raise ValueError(
            f"{name} {value!r} is a Python keyword, a builtin or a name IPython keeps (In, Out, _, _i1 ...): "
            f"storing the values there breaks later cells; use a name of your own such as 'values'"
        )
    return value


class Once(argparse.Action):
    """A flag given twice is an error, not "the last one wins" (``--dp-shard 2 --dp-shard 4``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} given twice; give it once")
        setattr(namespace, self.dest, values)


MAX_JSON_DEPTH = 100
"""Nesting ``--send`` and the run files may hold (JSON's own reader recurses, and a deeper document is no data
a run writes)."""


def json_names(value: object, where: str) -> None:
    """Data that JSON carries unchanged: dict keys must be strings (JSON turns ``{1: 'a'}`` into ``{'1': 'a'}``),
    nested at most ``MAX_JSON_DEPTH`` deep. Walked without recursion, so any depth is refused, not crashed on."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list, tuple)) and depth >= MAX_JSON_DEPTH:
            raise ValueError(f"{where}: nested more than {MAX_JSON_DEPTH} deep; send flatter data")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ValueError(
                        f"{where}: dict key {key!r} is not a string and would arrive as {str(key)!r}; "
                        f"use string keys or send a list of pairs"
                    )
                pending.append((child, depth + 1))
        elif isinstance(item, (list, tuple)):
            pending.extend((child, depth + 1) for child in item)


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


def launch(
    target: object, nproc: object, args: object, seconds: object, on_line: object, env: object
) -> tuple[list[str], float]:
    """``launch.torchrun``'s arguments: the entry (``launch_target``) and the timeout, or ``ValueError``
    naming the one that is wrong (``nproc`` within the rank cap, ``args`` strings, ``env`` strings)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int (number of worker processes), got {nproc!r}")
    rank_count(nproc, "nproc")
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise ValueError(f"args must be a sequence of strings such as ['--steps', '5'], got {args!r}")
    if bad := [arg for arg in args if isinstance(arg, bool) or not isinstance(arg, (str, os.PathLike, int, float))]:
        raise ValueError(f"args must be strings (or numbers, paths) such as ['--steps', '5'], got {bad[0]!r}")
    callback(on_line, "on_line")
    if env is not None and (
        not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise ValueError(f"env must be a dict of strings to strings such as {{'OMP_NUM_THREADS': '1'}}, got {env!r}")
    return launch_target(target), timeout(seconds)


MAX_WIDGET_STEPS = 50
"""The widgets' steps selector's range: a widget run is a lesson's, seconds long."""


def widget_degrees(degrees: Mapping[str, object], known: Sequence[str], max_world_size: int | None = None) -> None:
    """A widget's degrees: names it has, whole numbers >= 1 (dp_shard -1: what is left), world_size within
    ``max_world_size``."""
    unknown = set(degrees) - {"world_size", *known}
    if unknown:
        raise ValueError(f"unknown degree(s) {sorted(unknown)}; known: {['world_size', *known]}")
    for name, value in degrees.items():
        if not (name == "dp_shard" and value == -1):
            positive_int(value, name)
    if max_world_size is not None and degrees.get("world_size", 0) > max_world_size:
        raise ValueError(
            f"world_size={degrees['world_size']} is above max_world_size={max_world_size}; raise max_world_size "
            f"or choose fewer ranks"
        )


def widget_selection(
    steps: int | None, microbatches: object, max_world_size: object, degrees: Mapping[str, object], known: Sequence[str]
) -> None:
    """``DegreePicker`` / ``MeshWidget``'s starting selection (``steps`` already checked by ``steps``)."""
    if steps is not None and steps > MAX_WIDGET_STEPS:
        raise ValueError(f"steps must be at most {MAX_WIDGET_STEPS} in the widget (its selector's range), got {steps}")
    positive_int(max_world_size, "max_world_size")
    if microbatches is not None:
        positive_int(microbatches, "microbatches")
    widget_degrees(degrees, known, max_world_size)


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
