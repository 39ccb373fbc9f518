"""Past one machine: the command ``python -m launch command`` prints, run as two "nodes" on loopback,
trains M4 end to end; a run that does not match its reference fails the job (non-zero exit).

The two nodes run inside a fresh network namespace (``unshare -rn``) where only loopback exists,
because torch's c10d rendezvous store listens on every interface (docs/multi_node.md); where user
namespaces are unavailable the test is skipped.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import launch
from hyper_parallel.run_files import EXIT_MISMATCH

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[1]
PORT = 29555  # inside a private network namespace: nothing else can hold it

NODES = r"""
import json, subprocess, sys
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
argv, cwds = json.loads(sys.argv[1]), json.loads(sys.argv[2])
nodes = [subprocess.Popen(argv, cwd=cwd, stdout=open(f"{cwd}/out.txt", "w"), stderr=subprocess.STDOUT) for cwd in cwds]
print(json.dumps([node.wait(timeout=900) for node in nodes]))
"""


def _namespaces_work() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _namespaces_work(), reason="needs unshare -rn (user + network namespaces) and ip")
def test_two_loopback_nodes_run_m4_from_the_printed_command(tmp_path):
    out = tmp_path / "run"
    printed = subprocess.run(
        [sys.executable, "-m", "launch", "command", "M4", "--dp-shard", "4", "--nnodes", "2", "--nproc-per-node", "2"]
        + ["--rdzv-endpoint", f"127.0.0.1:{PORT}", "--steps", "1", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    lines = printed.stdout.splitlines()
    assert any("Trusted network only" in line for line in lines)
    command = shlex.split(lines[-1])
    assert command[0] == "torchrun" and command[-2:] == ["--out", str(out)]
    assert any(arg.startswith("--rdzv-id=hyper-parallel-") for arg in command)
    argv = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
    cwds = [str(tmp_path / f"node{i}") for i in (0, 1)]
    for cwd in cwds:
        os.mkdir(cwd)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["unshare", "-rn", sys.executable, "-c", NODES, json.dumps(argv), json.dumps(cwds)],
        capture_output=True, text=True, env=env, timeout=1200,
    )  # fmt: skip
    logs = "\n".join(Path(cwd, "out.txt").read_text() for cwd in cwds)
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[-1]) == [0, 0], done.stderr + logs
    metrics = json.loads((out / "metrics.json").read_text())  # rank 0's node, into --out
    assert metrics["ok"] is True and metrics["degrees"]["world_size"] == 4 and metrics["degrees"]["dp_shard"] == 4
    assert sorted(p.name for p in out.glob("trace_rank*.json")) == [f"trace_rank{r}.json" for r in range(4)]
    # the same run on one machine (4 ranks, fresh launch) gives the same losses
    local = launch.run("M4", world_size=4, dp_shard=4, steps=1, out=tmp_path / "local", pool=False)
    assert local.ok, local.error
    assert metrics["losses"] == local.metrics["losses"]


def test_a_worker_whose_run_mismatches_exits_non_zero(tmp_path):
    worker = ROOT / "tests" / "workers" / "mismatching_worker.py"
    args = ["--recipe", "M4", "--degrees", json.dumps({"dp_shard": 2}), "--steps", "1", "--out", str(tmp_path)]
    result = launch.torchrun(str(worker), 2, args=args, timeout=600)
    assert not result.ok and result.failed_rank == 0, result
    assert f"exitcode  : {EXIT_MISMATCH}" in result.error or f"exit code {EXIT_MISMATCH}" in result.error, result.error
    assert json.loads((tmp_path / "metrics.json").read_text())["ok"] is False
