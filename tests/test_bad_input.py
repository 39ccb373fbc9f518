"""Every bad input the reliability review found handled badly is refused before anything starts:
exit status 2 and ``error: <rule>`` from the CLI, ``ValueError`` naming the rule from Python and the
magic (``launch.inputs``, one validation layer). Nothing here starts a worker: the pool and torchrun
are replaced by a stub that fails the test if it is reached.

(``plan``'s own flags -- ``--seq-len``, ``--batch``, ``--top`` -- are checked by tests/test_plan.py.)
"""

from __future__ import annotations

import math
import os
import re

import pytest

import launch
from launch import cli, inputs
from launch.notebook import magic
from launch.processes.pool import Pool


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a bad input reached a launch: {args[:2]}")

    monkeypatch.setattr(Pool, "_start", refuse)
    monkeypatch.setattr("launch.runs.torchrun_claimed", refuse)
    monkeypatch.setattr("launch.processes.supervisor._launch", refuse)


CLI_CASES = [
    (["command", "M4", "--dp-shard", "4", "--nnodes", "-2", "--nproc-per-node", "-2"], "--nnodes must be"),
    (["command", "M4", "--dp-shard", "4", "--nnodes", "2", "--nproc-per-node", "2", "--steps", "0"], "steps must be"),
    (["command", "M4", "--dp-shard", "4", "--nnodes", "2", "--nproc-per-node", "2", "--steps", "-3"], "steps must be"),
    (["command", "M4", "--dp-shard", "4", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", "noport"],
     "HOST:PORT"),
    (["run", "M4", "--timeout", "-5"], "timeout must be a positive number"),
    (["run", "M4", "--timeout", "0"], "timeout must be a positive number"),
    (["run", "M4", "--timeout", "nan"], "timeout must be a positive number"),
    (["run", "M4", "--out", "/dev/null"], "exists and is not a directory"),
    (["run", "M4", "--steps", "0"], "steps must be"),
    (["run", "M4", "--dp-shard", "100000"], "world_size 100000 is more ranks than this machine can run"),
    (["run", "DeepEP", "--dp-shard", "2"], "DeepEP is not runnable on this stack: .*CUDA GPUs and NVSHMEM.*ExpertParallelExperts"),
    (["run", "HybridEP"], "HybridEP is not runnable on this stack"),
    (["run", "M3-A", "--tp", "2", "--seq-len", "18"], r"async TP cuts each rank's sequence shard .* into tp=2 chunks.*--seq-len"),
    (["run", "M6-A", "--cp", "2", "--tp", "4", "--seq-len", "48"], r"seq_len % \(cp\*tp\*tp\) == 0"),
    (["run", "M3-F8", "--tp", "4"], r"not multiples of 16\*tp = 64; torch._scaled_mm takes weight shards"),
    (["run", "M3-F8", "--tp", "2", "--global-batch", "2", "--seq-len", "4"], "the 8 tokens of a tp group"),
    # 3 rows of the MLP's 8 tokens per dp rank: the inner dim of each rank's float8 weight-gradient matmul
    (["run", "M4-F8", "--dp-shard", "4", "--global-batch", "12"],
     r"over the 24 tokens of a data-parallel rank \(global_batch/dp \* 8 tokens per row\).*change --global-batch"),
    (["run", "M4-F8", "--dp-shard", "2", "--tp", "2"], "recipe M4-F8 .* needs tp=1"),
]  # fmt: skip


@pytest.mark.parametrize("argv, rule", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_the_cli_exits_2_with_the_rule(argv, rule, capsys):
    assert cli.main(argv) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert re.search(rule, err), err


SEQUENCE_AND_PIPELINE_CASES = [  # (argv, the rule, the fix the message names)
    (["run", "M5-R", "--cp", "1"], r"M5-R .* needs cp > 1, got cp=1", r"set --cp \(cp=\) to 2 or more"),
    (["run", "M5-R", "--cp", "2", "--seq-len", "6"], r"seq_len=6 must be divisible by tp\*2\*cp = 1\*2\*2 = 4",
     r"set --seq-len \(launch.run's seq_len=\) to one of \[4, 8\]"),
    (["run", "M5-UR", "--cp", "2", "--ulysses", "8"], r"ulysses=8 must divide the heads of each tp rank",
     r"valid ulysses for tp=1: \[1, 2, 4\]"),
    (["run", "M5-UR", "--cp", "2", "--ulysses", "2", "--seq-len", "12"],
     r"seq_len=12 must be divisible by 2\*cp\*ulysses\*tp = 2\*2\*2\*1 = 8", r"nearest valid seq_len: 16"),
    (["run", "M5", "--cp", "2", "--ulysses", "2"], r"M5 .* does not split the sequence over a ulysses dim",
     r"recipes: M5-UR"),
    (["run", "P5", "--pp", "4", "--dp-shard", "2", "--microbatches", "4"],
     r"microbatches=4 must be >= the number of stages pp\*stages_per_rank = 8", r"to one of \[8\]"),
    (["run", "P5", "--pp", "4", "--dp-shard", "2", "--global-batch", "8"],
     r"4 rows \(global_batch=8 / dp=2\) cannot fill the 8 pipeline stages", r"--global-batch .* to one of \[16\]"),
    (["run", "P5", "--pp", "3"], r"n_layers=8 must be divisible by pp\*stages_per_rank = 3\*2 = 6",
     r"valid pp for 8 layers: \[2, 4\]"),
]  # fmt: skip


@pytest.mark.parametrize(
    "argv, rule, fix", SEQUENCE_AND_PIPELINE_CASES, ids=[" ".join(a) for a, _, _ in SEQUENCE_AND_PIPELINE_CASES]
)
def test_sequence_and_pipeline_rules_exit_2_before_any_worker(argv, rule, fix, capsys):
    """A ring of one rank, a sequence that does not cut into 2*cp zig-zag chunks, a ulysses degree that does
    not divide the heads or the sequence, a ulysses dim on a recipe without one, a schedule with more stages
    than microbatches or rows, and DualPipeV (P5) on an odd pp (8 layers do not split into 2 pp stages;
    torch's DualPipeV itself runs on odd pp): each exits 2 naming the rule and the fix (no worker starts:
    ``nothing_starts``)."""
    assert cli.main(argv) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert re.search(rule, err) and re.search(fix, err), err


def test_a_degree_flag_given_twice_is_refused(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["run", "M4", "--dp-shard", "2", "--dp-shard", "4"])
    assert exit.value.code == 2 and "--dp-shard given twice" in capsys.readouterr().err


PYTHON_CASES = [
    ({"recipe": None}, "recipe must be a recipe name"),
    ({"steps": 2.5}, "steps must be a whole number"),
    ({"steps": "3"}, "steps must be a whole number"),
    ({"steps": True}, "steps must be a whole number"),
    ({"seed": "x"}, "seed must be a whole number"),
    ({"seed": 1.5}, "seed must be a whole number"),
    ({"timeout": -5}, "timeout must be a positive number"),
    ({"timeout": 0}, "timeout must be a positive number"),
    ({"timeout": math.nan}, "timeout must be a positive number"),
    ({"timeout": -5, "pool": False}, "timeout must be a positive number"),
    ({"timeout": math.nan, "pool": False}, "timeout must be a positive number"),
    ({"out": "/dev/null"}, "exists and is not a directory"),
    ({"world_size": 10000}, "world_size 10000 is more ranks than this machine can run"),
]


@pytest.mark.parametrize("given, rule", PYTHON_CASES, ids=[repr(g) for g, _ in PYTHON_CASES])
def test_launch_run_raises_value_error_with_the_rule(given, rule):
    given = dict(given)
    recipe = given.pop("recipe", "M4")
    with pytest.raises(ValueError, match=rule):
        launch.run(recipe, **given)


MAGIC_CASES = [
    ("-n 2 --timeout -5", "1", "--timeout must be a positive number"),
    ("-n 2 --timeout 0", "1", "--timeout must be a positive number"),
    ("-n 2 --timeout nan", "1", "--timeout must be a positive number"),
    ("-n 10000", "1", "more ranks than this machine can run"),
    ("-n 2 --out 'not a name'", "1", "--out must be a Python variable name"),
    ("-n 2 --send d", "1", "dict key 1 is not a string"),
    ("-n 2", "x = (", "SyntaxError"),
]


@pytest.mark.parametrize("line, cell, rule", MAGIC_CASES, ids=[f"{line} | {cell}" for line, cell, _ in MAGIC_CASES])
def test_the_magic_shows_the_rule_and_starts_nothing(line, cell, rule, capsys, monkeypatch):
    monkeypatch.setattr(magic, "_user_namespace", lambda: {"d": {1: "a"}})
    assert magic.torchrun_magic(line, cell) is None
    assert rule in capsys.readouterr().err


def test_the_rank_cap_follows_the_cores_and_can_be_raised(monkeypatch):
    cap = (os.cpu_count() or 1) * inputs.RANKS_PER_CORE
    assert inputs.rank_count(cap) == cap
    with pytest.raises(ValueError, match=f"set {inputs.MAX_RANKS_ENV}={cap + 1}"):
        inputs.rank_count(cap + 1)
    monkeypatch.setenv(inputs.MAX_RANKS_ENV, str(cap + 1))
    assert inputs.rank_count(cap + 1) == cap + 1


@pytest.mark.parametrize("value", [0, -1, math.nan, "3", True, None])
def test_one_timeout_rule_everywhere(value):
    with pytest.raises(ValueError, match="positive number of seconds"):
        inputs.timeout(value)
    assert inputs.timeout(math.inf) == math.inf and inputs.timeout(2) == 2.0


def test_async_tp_without_sequence_parallelism_is_refused():
    """The rule M3-A and M6-A check through their shapes; a recipe without SP asking for async TP breaks it."""
    from hyper_parallel.mesh import ParallelDims

    with pytest.raises(ValueError, match="async TP pipelines sequence parallelism's .* turn sequence parallelism on"):
        ParallelDims(world_size=2, tp=2).check_model(seq_len=16, async_tp=True, sequence_parallel=False)


@pytest.mark.parametrize("args", [["M3-F8", "--tp", "2"], ["M4-F8", "--dp-shard", "4"]])
def test_float8_on_a_torch_without_scaled_mm_is_refused(capsys, monkeypatch, args):
    """The kernel probe runs in a child process (the launcher's never imports torch): here one whose torch
    lacks torch._scaled_mm; the run is refused with the fix, exit 2."""
    probe = "import torch; del torch._scaled_mm; " + inputs.SCALED_MM_PROBE
    monkeypatch.setattr(inputs, "SCALED_MM_PROBE", probe)
    assert cli.main(["run", *args]) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert "this build has no torch._scaled_mm" in err and "Fix: install a torch with it" in err


def test_float8_linears_whose_dims_are_not_multiples_of_16_are_refused():
    from hyper_parallel.mesh import ParallelDims

    with pytest.raises(ValueError, match=r"\[24\] not multiples of 16\*tp = 16; torch._scaled_mm .* Use model dims"):
        ParallelDims(world_size=4, dp_shard=4).check_model(float8_dims=(24, 64), global_batch=16, row_tokens=8)
