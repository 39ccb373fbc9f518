"""The bad-input table's Python side (tests/test_bad_input_table.py): ``launch.run`` / ``validate`` /
``run_many`` / ``torchrun`` / ``write_report``, the widgets, ``%%torchrun``'s line and cell, and the
environment variables; each with the rule its refusal must name (the CLI's: tests/bad_input_cases.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from bad_input_cases import LONG, Case, Paths, cli, magic, py

from launch.processes.run_dirs import RunDirError


def _launch_run(**kwargs) -> Callable[[Paths], object]:
    def call(p: Paths) -> object:
        import launch

        given = {k: (v.format(fx=p.fx, box=p.box) if isinstance(v, str) else v) for k, v in kwargs.items()}
        return launch.run(given.pop("recipe", "M4"), **given)

    return call


RUN_KWARGS = [
    ({"recipe": None}, r"recipe must be"),
    ({"recipe": 5}, r"recipe must be"),
    ({"recipe": ""}, r"recipe must be"),
    ({"recipe": "nope"}, r"unknown recipe|nope"),
    ({"recipe": ["M4"]}, r"recipe must be"),
    ({"steps": 0}, r"steps must be"),
    ({"steps": -1}, r"steps must be"),
    ({"steps": 2.5}, r"steps must be"),
    ({"steps": "3"}, r"steps must be"),
    ({"steps": True}, r"steps must be"),
    ({"seed": "x"}, r"seed must be"),
    ({"seed": 1.5}, r"seed must be"),
    ({"seed": 10**30}, r"seed"),
    ({"seed": -(10**30)}, r"seed"),
    ({"seed": True}, r"seed must be"),
    ({"timeout": -5}, r"timeout must be a positive"),
    ({"timeout": 0}, r"timeout must be a positive"),
    ({"timeout": math.nan}, r"timeout must be a positive"),
    ({"timeout": "30"}, r"timeout must be a positive"),
    ({"timeout": None}, r"timeout must be a positive"),
    ({"timeout": -5, "pool": False}, r"timeout must be a positive"),
    ({"out": "/dev/null"}, r"not a directory"),
    ({"out": 5}, r"out must be"),
    ({"out": ""}, r"out must be"),
    ({"out": "/proc"}, r"/proc"),
    ({"out": "{fx}/plain.txt"}, r"not a directory"),
    ({"out": "{fx}/shared_dir"}, r"writable"),
    ({"out": LONG}, r"out|too long"),
    ({"dp_shard": "2"}, r"dp_shard"),
    ({"dp_shard": 2.5}, r"dp_shard"),
    ({"dp_shard": 0}, r"dp_shard"),
    ({"dp_shard": -2}, r"dp_shard"),
    ({"dp_shard": True}, r"dp_shard"),
    ({"world_size": 10000}, r"more ranks than this machine"),
    ({"world_size": "2"}, r"world_size"),
    ({"tp": None, "foo": 2}, r"foo"),
    ({"overlap": "yes"}, r"overlap must be"),
    ({"overlap": 2}, r"overlap must be"),
    ({"reshard_after_forward": "no"}, r"reshard_after_forward must be"),
    ({"link": "fast"}, r"link must be .*preset"),
    ({"link": 5}, r"link must be"),
    ({"link": "-2ms,1MB/s"}, r"link must be"),
    ({"link": "0ms,0MB/s"}, r"bytes_per_s must be"),
    ({"on_line": 5}, r"on_line"),
    ({"on_progress": "x"}, r"on_progress"),
    ({"pool": "yes"}, r"pool"),
    ({"recipe": "S1", "global_batch": 0}, r"global_batch"),
    ({"recipe": "S1", "global_batch": "8"}, r"global_batch"),
    ({"recipe": "S1", "seq_len": -1}, r"seq_len"),
    ({"recipe": "S1", "num_experts": 3}, r"num_experts"),
    ({"recipe": "P1", "microbatches": 0}, r"microbatches"),
    ({"recipe": "P1", "microbatches": 3.0}, r"microbatches"),
    ({"recipe": "M4", "microbatches": 2}, r"microbatches"),
]


def _call(fn_path: str, *args, **kwargs) -> Callable[[Paths], object]:
    """``fn_path`` ('module:name') called with the arguments, ``{fx}``/``{box}`` filled in strings."""

    def fill(value):
        if isinstance(value, str):
            return value.format(fx=p_holder[0].fx, box=p_holder[0].box)
        if isinstance(value, list):
            return [fill(v) for v in value]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value

    p_holder: list[Paths] = []

    def call(p: Paths) -> object:
        import importlib

        p_holder[:] = [p]
        module, name = fn_path.split(":")
        return getattr(importlib.import_module(module), name)(*fill(list(args)), **fill(kwargs))

    return call


M4 = {"recipe": "M4"}
PYTHON_CASES = [
    *[py("launch.run", repr(kwargs), _launch_run(**kwargs), rule) for kwargs, rule in RUN_KWARGS],
    py("launch.validate", "nope", _call("launch.runs:validate", "nope"), r"unknown recipe|nope"),
    py("launch.validate", "dp_shard=3, world_size=4", _call("launch.runs:validate", "M4", dp_shard=3, world_size=4),
       r"dp_shard|world"),
    py("launch.validate", "steps=0", _call("launch.runs:validate", "M4", steps=0), r"steps must be"),
    py("launch.validate", "seed=1e30", _call("launch.runs:validate", "M4", seed=10**30), r"seed"),
    py("launch.validate", "world 1e9", _call("launch.runs:validate", "M4", dp_shard=10**9),
       r"more ranks|world_size=1000000000 is above"),
    py("run_many", "'M4'", _call("launch.runs:run_many", "M4"), r"runs|RunSpec|dict"),
    py("run_many", "[None]", _call("launch.runs:run_many", [None]), r"runs|RunSpec|dict"),
    py("run_many", "[5]", _call("launch.runs:run_many", [5]), r"runs|RunSpec|dict"),
    py("run_many", "[]", _call("launch.runs:run_many", []), r"at least one run"),
    py("run_many", "None", _call("launch.runs:run_many", None), r"runs|at least one"),
    py("run_many", "two runs one out", _call("launch.runs:run_many", [{**M4, "out": "{box}/d"}] * 2),
       r"its own out folder"),
    py("run_many", "world sizes differ", _call("launch.runs:run_many", [M4, {"recipe": "S1"}]), r"world size"),
    py("run_many", "timeout=0", _call("launch.runs:run_many", [M4], timeout=0), r"timeout must be"),
    py("run_many", "out=/dev/null", _call("launch.runs:run_many", [M4], out="/dev/null"), r"not a directory"),
    py("run_many", "on_line=5", _call("launch.runs:run_many", [M4], on_line=5), r"on_line"),
    py("run_many", "on_progress=5", _call("launch.runs:run_many", [M4], on_progress=5), r"on_progress"),
    py("run_many", "recipe key missing", _call("launch.runs:run_many", [{"steps": 2}]), r"recipe must be"),
    py("run_many", "unknown key", _call("launch.runs:run_many", [{**M4, "stepz": 2}]), r"stepz"),
    py("run_many", "bad steps", _call("launch.runs:run_many", [{**M4, "steps": 0}]), r"steps must be"),
    py("launch.torchrun", "target 5", _call("launch.processes.supervisor:torchrun", 5, 2), r"target"),
    py("launch.torchrun", "target ''", _call("launch.processes.supervisor:torchrun", "", 2), r"target"),
    py("launch.torchrun", "missing .py", _call("launch.processes.supervisor:torchrun", "{box}/nope.py", 2),
       r"not found"),
    py("launch.torchrun", "'a b'", _call("launch.processes.supervisor:torchrun", "a b", 2), r"target"),
    py("launch.torchrun", "a folder", _call("launch.processes.supervisor:torchrun", "{fx}/not_a_run", 2),
       r"target|not_a_run"),
    py("launch.torchrun", "nproc 0", _call("launch.processes.supervisor:torchrun", "json", 0), r"nproc"),
    py("launch.torchrun", "nproc -1", _call("launch.processes.supervisor:torchrun", "json", -1), r"nproc"),
    py("launch.torchrun", "nproc 100000", _call("launch.processes.supervisor:torchrun", "json", 100000),
       r"more ranks than this machine"),
    py("launch.torchrun", "nproc '2'", _call("launch.processes.supervisor:torchrun", "json", "2"), r"nproc"),
    py("launch.torchrun", "nproc 2.0", _call("launch.processes.supervisor:torchrun", "json", 2.0), r"nproc"),
    py("launch.torchrun", "nproc True", _call("launch.processes.supervisor:torchrun", "json", True), r"nproc"),
    py("launch.torchrun", "args a string", _call("launch.processes.supervisor:torchrun", "json", 2, "--x"), r"args"),
    py("launch.torchrun", "args [5, None]", _call("launch.processes.supervisor:torchrun", "json", 2, [5, None]),
       r"args"),
    py("launch.torchrun", "timeout 0", _call("launch.processes.supervisor:torchrun", "json", 2, timeout=0),
       r"timeout must be"),
    py("launch.torchrun", "on_line 5", _call("launch.processes.supervisor:torchrun", "json", 2, on_line=5),
       r"on_line"),
    py("launch.torchrun", "env a list", _call("launch.processes.supervisor:torchrun", "json", 2, env=["A=1"]),
       r"env"),
    py("launch.torchrun", "env int value", _call("launch.processes.supervisor:torchrun", "json", 2, env={"A": 1}),
       r"env"),
    py("launch.torchrun", "run_dir /dev/null",
       _call("launch.processes.supervisor:torchrun", "json", 2, run_dir="/dev/null"), r"/dev/null"),
    py("launch.torchrun", "run_dir a file",
       _call("launch.processes.supervisor:torchrun", "json", 2, run_dir="{fx}/plain.txt"), r"plain.txt"),
    py("write_report", "None", _call("launch.report:write_report", None), r"run_dir|run directory"),
    py("write_report", "missing", _call("launch.report:write_report", "{box}/missing"), r"missing"),
    py("write_report", "a file", _call("launch.report:write_report", "{fx}/plain.txt"), r"plain.txt"),
    py("write_report", "not a run", _call("launch.report:write_report", "{fx}/not_a_run"), r"not_a_run|summary"),
    py("write_report", "nested metrics", _call("launch.report:write_report", "{fx}/nested_metrics"),
       r"nested_metrics|metrics|summary"),
    py("write_report", "degrees 'abc'", _call("launch.report:write_report", "{fx}/bad_degrees"), r"degrees"),
]  # fmt: skip


def _widget(cls: str, *args, **kwargs) -> Callable[[Paths], object]:
    module = {"PlanWidget": "launch.notebook.widgets.plan_widget"}.get(cls, "launch.notebook.widgets")
    return _call(f"{module}:{cls}", *args, **kwargs)


def _mesh_widget_launch(**kwargs) -> Callable[[Paths], object]:
    """MeshWidget(**kwargs).launch(), waited for: a bad launch setting is refused by the constructor or the launch."""

    def call(p: Paths) -> object:
        from launch.notebook.widgets import MeshWidget

        widget = MeshWidget("M4", preview=False, **kwargs)
        thread = widget.launch()
        if thread is not None:
            thread.join(10)
        if widget.run_error:
            raise ValueError(widget.run_error)
        return widget

    return call


WIDGET_CASES = [
    py("widgets", "MeshWidget('nope')", _widget("MeshWidget", "nope", preview=False), r"unknown recipe|nope"),
    py("widgets", "MeshWidget(None)", _widget("MeshWidget", None, preview=False), r"recipe must be"),
    py("widgets", "MeshWidget(steps=0)", _widget("MeshWidget", "M4", steps=0, preview=False), r"steps must be"),
    py("widgets", "MeshWidget(steps=1000)", _widget("MeshWidget", "M4", steps=1000, preview=False), r"steps"),
    py("widgets", "MeshWidget(steps='3')", _widget("MeshWidget", "M4", steps="3", preview=False), r"steps must be"),
    py("widgets", "MeshWidget(timeout=-5)", _mesh_widget_launch(timeout=-5), r"timeout must be a positive"),
    py("widgets", "MeshWidget(timeout=nan)", _mesh_widget_launch(timeout=math.nan), r"timeout must be a positive"),
    py("widgets", "MeshWidget(timeout='x')", _mesh_widget_launch(timeout="x"), r"timeout must be a positive"),
    py("widgets", "MeshWidget(out=/dev/null)", _mesh_widget_launch(out="/dev/null"), r"not a directory|/dev/null"),
    py("widgets", "MeshWidget(foo=2)", _widget("MeshWidget", "M4", foo=2, preview=False), r"foo"),
    py("widgets", "MeshWidget(dp_shard=0)", _widget("MeshWidget", "M4", dp_shard=0, preview=False), r"dp_shard"),
    py("widgets", "MeshWidget(dp_shard='2')", _widget("MeshWidget", "M4", dp_shard="2", preview=False), r"dp_shard"),
    py("widgets", "MeshWidget('P1', microbatches=0)", _widget("MeshWidget", "P1", microbatches=0, preview=False),
       r"microbatches"),
    py("widgets", "MeshWidget(max_world_size=0)", _widget("MeshWidget", "M4", max_world_size=0, preview=False),
       r"max_world_size"),
    py("widgets", "MeshWidget(recipes=['nope'])", _widget("MeshWidget", "M4", recipes=["nope"], preview=False),
       r"unknown recipe|nope"),
    py("widgets", "DegreePicker(5)", _widget("DegreePicker", 5, preview=False), r"recipe must be"),
    py("widgets", "DegreePicker(steps=-1)", _widget("DegreePicker", "M4", steps=-1, preview=False), r"steps must be"),
    py("widgets", "DegreePicker(foo=2)", _widget("DegreePicker", "M4", foo=2, preview=False), r"foo"),
    py("widgets", "DegreePicker(max_world_size=-1)", _widget("DegreePicker", "M4", max_world_size=-1, preview=False),
       r"max_world_size"),
    py("widgets", "DegreePicker(world_size=100000)", _widget("DegreePicker", "M4", world_size=100000, preview=False),
       r"world_size"),
    py("widgets", "PlanWidget(model='nope')", _widget("PlanWidget", model="nope"), r"model|nope"),
    py("widgets", "PlanWidget(model=5)", _widget("PlanWidget", model=5), r"model"),
    py("widgets", "PlanWidget(model_config=nested)", _widget("PlanWidget", model_config="{fx}/nested.json"),
       r"config|nest"),
    py("widgets", "PlanWidget(model_config=missing)", _widget("PlanWidget", model_config="{box}/missing.json"),
       r"missing.json"),
    py("widgets", "PlanWidget(model_config=/dev/zero)", _widget("PlanWidget", model_config="/dev/zero"),
       r"/dev/zero"),
    py("widgets", "PlanWidget(world_size=0)", _widget("PlanWidget", world_size=0), r"world_size"),
    py("widgets", "PlanWidget(world_size=-8)", _widget("PlanWidget", world_size=-8), r"world_size"),
    py("widgets", "PlanWidget(world_size='x')", _widget("PlanWidget", world_size="x"), r"world_size"),
    py("widgets", "PlanWidget(world_size=2**30)", _widget("PlanWidget", world_size=2**30), r"world_size"),
    py("widgets", "PlanWidget(gpus_per_node=0)", _widget("PlanWidget", gpus_per_node=0), r"gpus_per_node"),
    py("widgets", "PlanWidget(memory_gib=-1)", _widget("PlanWidget", memory_gib=-1), r"memory_gib"),
    py("widgets", "PlanWidget(memory_gib=nan)", _widget("PlanWidget", memory_gib=math.nan), r"memory_gib"),
    py("widgets", "PlanWidget(foo=2)", _widget("PlanWidget", foo=2), r"foo"),
    py("widgets", "PlanWidget(tp=0)", _widget("PlanWidget", world_size=8, tp=0), r"tp"),
]  # fmt: skip

MAGIC_CASES = [
    magic("-n 0", "1", r"-n must be at least 1"),
    magic("-n -1", "1", r"-n must be at least 1"),
    magic("-n x", "1", r"usage|-n"),
    magic("-n 10000", "1", r"more ranks than this machine"),
    magic("", "1", r"usage"),
    magic("-n 2 --timeout -5", "1", r"--timeout must be a positive"),
    magic("-n 2 --timeout 0", "1", r"--timeout must be a positive"),
    magic("-n 2 --timeout nan", "1", r"--timeout must be a positive"),
    magic("-n 2 --timeout x", "1", r"usage|--timeout"),
    magic("-n 2 --out 'not a name'", "1", r"--out must be a Python variable name"),
    magic("-n 2 --out if", "1", r"--out"),
    magic("-n 2 --out __builtins__", "1", r"--out"),
    magic("-n 2 --out get_ipython", "1", r"--out"),
    magic("-n 2 --out In", "1", r"--out"),
    magic("-n 2 --out _", "1", r"--out"),
    magic("-n 2 --send missing", "1", r"no kernel variable named missing"),
    magic("-n 2 --send d", "1", r"dict key 1 is not a string"),
    magic("-n 2 --send deep", "1", r"--send deep"),
    magic("-n 2 --send s", "1", r"--send"),
    magic("-n 2 --send f", "1", r"--send"),
    magic('-n 2 --send "a', "1", r"quot|usage"),
    magic("-n 2 --foo", "1", r"usage"),
    magic("-n 2", "x = (", r"SyntaxError"),
    magic("-n 2", "def f(:\n  pass", r"SyntaxError"),
    magic("-n 2", "\x00", r"null|SyntaxError|compile"),
    magic("-n 2 -n 3", "1", r"-n"),
]

ENV_CASES = [
    py("environment", f"HYPER_PARALLEL_MAX_RANKS={value}", _launch_run(), r"HYPER_PARALLEL_MAX_RANKS",
       env={"HYPER_PARALLEL_MAX_RANKS": value})
    for value in ("abc", "0", "-1", "1.5", "")
] + [
    py("environment", f"HYPER_PARALLEL_POOL_START_TIMEOUT={value}", _launch_run(),
       r"HYPER_PARALLEL_POOL_START_TIMEOUT|start_timeout", env={"HYPER_PARALLEL_POOL_START_TIMEOUT": value})
    for value in ("abc", "-1", "nan", "0")
] + [
    py("environment", f"HYPER_PARALLEL_SCRATCH={value}", _launch_run(), r"HYPER_PARALLEL_SCRATCH|scratch",
       env={"HYPER_PARALLEL_SCRATCH": value}, errors=(ValueError, RunDirError))
    for value in ("/dev/null", "{fx}/plain.txt", "/proc/x", "{fx}/plain.txt/sub", "{fx}/shared_dir", "{fx}/link_dir")
] + [
    cli("run M4", r"HYPER_PARALLEL_SCRATCH|scratch", env={"HYPER_PARALLEL_SCRATCH": "{fx}/plain.txt"}),
    cli("run M4", r"HYPER_PARALLEL_MAX_RANKS", env={"HYPER_PARALLEL_MAX_RANKS": "abc"}),
    py("environment", "HYPER_PARALLEL_OVERLAP=maybe", _launch_run(), r"HYPER_PARALLEL_OVERLAP",
       env={"HYPER_PARALLEL_OVERLAP": "maybe"}),
]  # fmt: skip

API_CASES: list[Case] = [*PYTHON_CASES, *WIDGET_CASES, *MAGIC_CASES, *ENV_CASES]


def _deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


MAGIC_NAMESPACE = {"d": {1: "a"}, "deep": _deep(100_000), "s": {1, 2}, "f": print}
"""The kernel variables ``--send`` names: a dict with an int key, data nested past Python's recursion limit,
a set and a function (neither is JSON)."""
