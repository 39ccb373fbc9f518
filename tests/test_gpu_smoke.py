"""``make gpu-smoke`` (tools/gpu_smoke.py): it refuses at once where torch sees no GPU, and its checks run.

This machine has no GPU, so the script's own checks are held by its rehearsal on the CPU (gloo): the same
code paths, a few recipes per check. Each check compares against an independent computation (the
single-process reference, the host's losses), so a rehearsal that passes has shown them able to pass, and
the references it reports are the recipes' own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_smoke.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the smoke would run, not refuse")
def test_refuses_at_once_without_a_gpu(tmp_path):
    out = tmp_path / "smoke.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "needs a CUDA GPU" in done.stderr and "--rehearse-on-cpu" in done.stderr
    assert not out.exists()


@pytest.mark.distributed
def test_rehearsal_on_the_cpu_runs_every_check(tmp_path):
    """...and leaves none of its threaded runs' folders behind."""
    out, scratch = tmp_path / "smoke.json", tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rehearse-on-cpu", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"]
    assert [row["model"] for row in report["references"]] == ["MLP", "transformer", "MoE transformer"]
    assert {row["recipe"] for row in report["world_one"]} == {"A-FSDP2", "B-3", "C-MoE"}
    assert [(row["recipe"], row["world_size"]) for row in report["threaded"]] == [("M4", 2), ("M2", 2)]
    assert all(row["max_abs_diff"] is not None for row in report["world_one"] + report["threaded"])
    assert {"fp32", "bf16"} <= set(report["bench_compute"])
    assert not list(scratch.glob("hp-smoke-*"))  # the scratch root and torch caches are kept by design
