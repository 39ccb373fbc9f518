"""What a launch leaves behind: nothing when its launching process dies, no socket off loopback,
no collision between two launches at once, no scratch directory kept forever.

The parent-death tests start a separate "kernel" process that calls ``launch.torchrun`` on
tests/workers/fault_worker.py in ``hang`` mode (rank 0 blocks in an all_reduce that rank 1 never
joins), wait until rank 0 is blocked, look at the sockets of every process under the kernel with
psutil, then kill the kernel.  Survivors are looked for by the pids psutil saw and by those the
workers wrote themselves, independently of the launcher.
"""

import contextlib
import ipaddress
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import process_alive

import launch
from launch.processes import run_dirs

WORKER = Path(__file__).parent / "workers" / "fault_worker.py"
REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 180.0  # generous: other jobs may share the 2 cores
GONE_WITHIN = 10.0  # the bound from the kernel's death to the last process gone
KERNEL = """
import sys
from launch.processes.supervisor import torchrun
torchrun(sys.argv[1], 2, args=["hang"], timeout=900, run_dir=sys.argv[2],
         on_line=lambda rank, line: print(rank, line, flush=True))
"""


pytestmark = pytest.mark.usefixtures("no_warm_pool")  # these tests watch every process this one starts


def _wait_for_line(kernel: subprocess.Popen, wanted: str, timeout: float) -> None:
    selector, buffer, deadline = selectors.DefaultSelector(), b"", time.monotonic() + timeout
    selector.register(kernel.stdout, selectors.EVENT_READ)
    while wanted.encode() not in buffer:
        if time.monotonic() > deadline or kernel.poll() is not None:
            raise AssertionError(f"no {wanted!r} from the launch within {timeout:g} s; output:\n{buffer.decode()}")
        if selector.select(1.0):
            buffer += os.read(kernel.stdout.fileno(), 65536)
    selector.close()


def _listening(process: psutil.Process) -> list[str]:
    return [conn.laddr.ip for conn in process.net_connections(kind="inet") if conn.status == psutil.CONN_LISTEN]


@pytest.mark.distributed
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_hanging_ranks_die_with_their_launcher_and_listen_on_loopback_only(tmp_path, signum):
    """SIGTERM (Jupyter's shutdown) and SIGKILL (a restart that got no answer) of the launching
    process: its own cleanup never runs, so only the kernel's parent-death signal can end the
    agent and the ranks.  While they run, every listening socket of the agent (the rendezvous
    store) and of each worker (gloo) must be on a loopback address (127.0.0.0/8 or ::1)."""
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL, str(WORKER), str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    tree, listening = [], {}
    try:
        _wait_for_line(kernel, "0 rank 0 entering all_reduce", START_TIMEOUT)
        time.sleep(1.0)  # rank 0 is inside the all_reduce now
        tree = psutil.Process(kernel.pid).children(recursive=True)
        listening = {proc.pid: _listening(proc) for proc in tree}
    finally:
        kernel.send_signal(signum)
        kernel.wait()
        killed_at = time.monotonic()
        kernel.stdout.close()
    workers = {int(path.read_text().split()[0]) for path in tmp_path.glob("pid_rank*")}
    pids = {proc.pid for proc in tree} | workers
    while [pid for pid in pids if process_alive(pid)] and time.monotonic() - killed_at < GONE_WITHIN:
        time.sleep(0.1)
    survivors = [pid for pid in pids if process_alive(pid)]
    for pid in survivors:  # so a failure does not leave ranks hanging on the machine
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    assert len(workers) == 2 and workers < {proc.pid for proc in tree}
    assert not survivors, f"still running {GONE_WITHIN:g} s after the launcher died"
    assert all(listening[pid] for pid in pids), f"a process listened on nothing, so the check saw nothing: {listening}"
    off_loopback = {
        pid: ips for pid, ips in listening.items() if not all(ipaddress.ip_address(ip).is_loopback for ip in ips)
    }
    assert not off_loopback, f"listening on a non-loopback address: {off_loopback}"


@pytest.mark.distributed
def test_two_launches_at_once_both_succeed(tmp_path, monkeypatch):
    """Two recipes launched at the same time from two threads (two notebooks, or a notebook and a
    test run), each into a fresh scratch directory: both must match their single-process
    reference, in directories of their own."""
    monkeypatch.setenv(run_dirs.SCRATCH_ENV, str(tmp_path))
    results = {}

    def run(recipe: str) -> None:
        results[recipe] = launch.run(recipe, steps=1, timeout=600, pool=False)  # two launches, not one pool

    threads = [threading.Thread(target=run, args=(recipe,)) for recipe in ("M1", "M4")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["M1", "M4"]
    for result in results.values():
        assert result.ok, result.error
        assert result.run_dir.parent.parent == tmp_path  # scratch/hp-run-XXXX/00-M1
    assert results["M1"].run_dir.parent != results["M4"].run_dir.parent
    for recipe, other in (("M1", "M4"), ("M4", "M1")):  # each launch's logs hold its own ranks only
        rank0 = results[recipe].logs[0]
        assert any(line.startswith(f"{recipe}: max |loss") for line in rank0)
        assert not any(line.startswith(f"{other}:") for line in rank0)


def test_a_directory_in_use_is_refused_to_a_second_launch(tmp_path):
    with run_dirs.claimed(tmp_path), pytest.raises(RuntimeError, match="another launch that is still running"):
        launch.torchrun(str(WORKER), 2, args=["ok"], run_dir=tmp_path)
    with run_dirs.claimed(tmp_path):  # released once the first launch is over
        pass


def test_scratch_keeps_recent_and_claimed_directories_only(tmp_path):
    """Ages set by hand: 'old' and 'old_but_running' untouched for 2 days ('old_but_running' claimed by a
    launch), 'oldish' for 1 hour, three fresh ones.  With max_age 1 day and max_kept 3: 'old' goes by
    age, 'oldish' by count (the three fresh ones are newer), the claimed one stays whatever its age."""
    now = time.time()
    ages = {"old": 2 * 24 * 3600, "old_but_running": 2 * 24 * 3600, "oldish": 3600, "new": 2, "newer": 1, "newest": 0}
    for name in ages:
        (tmp_path / name).mkdir()
    with run_dirs.claimed(tmp_path / "old_but_running"):
        for name, age in ages.items():
            os.utime(tmp_path / name, (now - age, now - age))
        removed = run_dirs.prune(tmp_path, max_age=24 * 3600, max_kept=3)
    assert sorted(path.name for path in removed) == ["old", "oldish"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["new", "newer", "newest", "old_but_running"]
