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


def short(value: float) -> str:
    """2.4e-7, as the docs write it (Python writes 2.4e-07)."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def test_the_measured_gpu_run_in_setup_md_is_the_committed_json():
    """docs/setup.md's figures of the H200 run are read off the run's own JSON, beside it in docs/."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    report = json.loads((docs / "gpu_smoke_h200.json").read_text())
    text = " ".join((docs / "setup.md").read_text().split())
    checks = [*report["references"], *report["world_one"], *report["threaded"], report["bench_compute"]]
    passed = sum(check["ok"] for check in checks)
    threaded = report["threaded"]
    bench = report["bench_compute"]
    relative = abs(bench["bf16"]["first_loss"] - bench["fp32"]["first_loss"]) / abs(bench["fp32"]["first_loss"])
    mlp = report["references"][0]
    figures = [
        f"torch **{report['torch']}**",
        f"**{passed} of {len(checks)} checks in {report['seconds']:.0f} s**",
        f"the MLP's within {short(max(abs(a - b) for a, b in zip(mlp['losses'], mlp['host_losses'])))}",
        f"the {len(report['world_one'])} recipes that run on one rank",
        f"{len(threaded)} multi-rank shapes as threads",
        f"within {short(max(row['max_abs_diff'] for row in threaded))} of its reference",
        f"{bench['fp32']['median_ms']:.1f} ms in fp32 and {bench['bf16']['median_ms']:.1f} ms under bf16",
        f"within {short(relative)} relative",
    ]
    assert [figure for figure in figures if figure not in text] == []
    assert all(row["max_abs_diff"] == 0 for row in report["world_one"]) and "every `max_abs_diff` 0" in text
    assert all(ref["losses"] == ref["host_losses"] for ref in report["references"][1:])
