"""Negative cases: each illegal configuration exits non-zero with its rule's message, before any worker
starts (no run directory appears) and without importing torch. The same list is in docs/cli.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NEGATIVE_CASES = [
    pytest.param(
        ["run", "S2", "--world", "8", "--dp-shard", "4", "--tp", "2", "--ep", "2", "--etp", "4"],
        "with ep=2, etp must be 1 or equal to tp=2; got etp=4",
        id="illegal-etp",
    ),
    pytest.param(
        ["run", "M6", "--world", "8", "--dp-shard", "2", "--cp", "2", "--tp", "2", "--etp", "2"],
        "etp=2 requires ep > 1",
        id="etp-without-ep",
    ),
    pytest.param(
        ["run", "M7", "--world", "8", "--dp-replicate", "2", "--dp-shard", "2"],
        "world-size equation violated: dp_replicate*dp_shard*cp*tp*pp = 2*2*1*1*1 = 4 != world_size=8",
        id="world-size-mismatch",
    ),
    pytest.param(
        ["run", "M6", "--world", "16", "--dp-shard", "1", "--cp", "4", "--tp", "4", "--seq-len", "16"],
        "seq_len=16 must be divisible by tp*2*cp = 4*2*4 = 32",
        id="seq-len-not-divisible",
    ),
    pytest.param(
        ["run", "S1", "--world", "8", "--dp-shard", "8", "--ep", "8", "--num-experts", "4"],
        "num_experts=4 must be divisible by ep=8",
        id="experts-not-divisible",
    ),
    pytest.param(
        ["run", "M4", "--world", "4", "--dp-shard", "2", "--pp", "2"],
        "recipe M4 (FSDP only) does not pipeline: it needs pp=1, got pp=2",
        id="pp-on-a-recipe-without-stages",
    ),
    pytest.param(
        ["run", "P1", "--pp", "2", "--dp-shard", "4", "--microbatches", "4"],
        "each data-parallel rank's 2 rows (global_batch=8 / dp=4) must split into microbatches=4 equal microbatches; "
        "valid microbatches: [2]; set --microbatches (launch.run's microbatches=) to one of [2]",
        id="microbatches-do-not-fit",
    ),
    pytest.param(["run", "M99"], "unknown recipe 'M99'", id="unknown-recipe"),
    pytest.param(
        ["run", "M4", "--dp-shard", "2", "--tp", "2"], "recipe M4 (FSDP only) needs tp=1", id="recipe-constraint"
    ),
    pytest.param(
        ["check", "--world", "8", "--tp", "4", "--ep", "2"],
        "ep=2 does not fit the mesh (etp == 1: EP borrows all of cp*tp and part of dp_shard)",
        id="ep-does-not-fit",
    ),
]


@pytest.mark.parametrize("args, message", NEGATIVE_CASES)
def test_negative_case_exits_before_any_worker(args, message, tmp_path):
    out = tmp_path / "run"
    extra = ["--out", str(out)] if args[0] == "run" else []
    code = (
        "import sys; from launch.cli import main; status = main(sys.argv[1:]); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(status)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args, *extra], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert "no torch" in done.stdout  # refused by the rules alone, in a fraction of a second
    assert not out.exists(), "a run directory was created: something started"
