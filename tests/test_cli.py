"""`python -m launch`: check, list, command and run (invalid input: tests/test_negative_cases.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def launch_cli(*args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "launch", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    return done, time.perf_counter() - start


def test_check_prints_views_and_groups():
    done, _ = launch_cli("check", "--world", "8", "--dp-shard", "2", "--cp", "2", "--tp", "2")
    assert done.returncode == 0, done.stderr
    assert "fsdp   dp_replicate=1 x fsdp=4 x tp=2" in done.stdout
    # hand-derived: tp innermost -> [0,1]; cp stride tp=2 -> [0,2]; fsdp = dp_shard*cp -> stride 2
    assert "tp            size 2    [[0, 1], [2, 3]]" in done.stdout
    assert "cp            size 2    [[0, 2], [1, 3]]" in done.stdout
    assert "fsdp          size 4    [[0, 2, 4, 6], [1, 3, 5, 7]]" in done.stdout


def test_list_shows_the_matrix():
    done, _ = launch_cli("list")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].split()[:5] == ["recipe", "tier", "ranks:", "default", "dims"]
    rows = {line.split()[0]: line for line in lines[2:] if line.strip() and not line.startswith("status")}
    assert {"M1", "M2", "M3", "M4", "M5", "M6", "M7", "S1", "S2", "S3", "C"} <= set(rows)
    assert "8: dp_shard=2 x cp=2 x tp=2" in rows["M6"] and "checked on 2 meshes" in rows["M6"]


def test_multinode_command_uses_c10d_rendezvous():
    done, _ = launch_cli(
        "command", "M4", "--dp-shard", "4", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", "node0:29500"
    )
    assert done.returncode == 0, done.stderr
    command = done.stdout.splitlines()[-1]
    assert command.startswith("torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d")
    assert "--rdzv-endpoint=node0:29500" in command and "--recipe M4" in command
    done, _ = launch_cli("command", "M4", "--dp-shard", "4", "--nnodes", "3", "--nproc-per-node", "2")
    assert done.returncode == 2 and "!= world_size=4" in done.stderr


@pytest.mark.distributed
def test_run_writes_summary_and_traces(tmp_path):
    out = tmp_path / "m1"
    done, _ = launch_cli("run", "M1", "--dp-shard", "2", "--steps", "2", "--out", str(out), "--quiet", "--chrome-trace")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "step 2/2 [####################]" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "M1" and summary["ok"] is True
    assert summary["degrees"]["dp_shard"] == 2 and summary["degrees"]["world_size"] == 2
    assert len(summary["losses"]) == len(summary["reference_losses"]) == 2
    assert summary["max_abs_diff"] <= 1e-5 * max(abs(x) for x in summary["reference_losses"])
    assert sorted(p.name for p in out.glob("trace_rank*.json")) == ["trace_rank0.json", "trace_rank1.json"]
    for name in ("mesh", "placements", "timeline", "comm_volume", "numerics"):
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.svg").stat().st_size > 0
    chrome = json.loads((out / "chrome_trace.json").read_text())["traceEvents"]
    slices = [e for e in chrome if e["ph"] == "X" and e["tid"] != "compute"]
    # M1 on 2 ranks, 2 steps: 3 units x 1 all-reduce per step per rank, nothing else
    assert len(slices) == 2 * 2 * 3 and {e["name"] for e in slices} == {"all_reduce[dp_replicate+fsdp]"}
    # compute has its own track: every span of every step of each rank, between fully_shard's hooks
    compute = [e for e in chrome if e["ph"] == "X" and e["tid"] == "compute"]
    traced = [
        e
        for rank in (0, 1)
        for e in json.loads((out / f"trace_rank{rank}.json").read_text())["events"]
        if e["kind"] == "compute"
    ]
    assert compute and len(compute) == len(traced)


def test_workbook_without_notebooks_fails_loudly(tmp_path, capsys):
    """Installed as a library there is no notebooks/ folder: exit 1 and say where they are, never
    "0 notebooks, 0 failed" with status 0."""
    from launch.notebook.papermill import run_workbook

    (tmp_path / "empty").mkdir()
    assert run_workbook(tmp_path / "out", notebooks_dir=tmp_path / "empty") == 1
    assert "found no notebooks" in capsys.readouterr().err
