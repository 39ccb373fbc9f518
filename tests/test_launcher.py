"""Fault tests for launch.torchrun: every launch, however it ends, leaves no process behind.

Each test starts one 2-rank torchrun (a few seconds of torch imports per rank on 2 cores); the
faults are injected by one small worker script, tests/workers/fault_worker.py.  Survivors are
looked for independently of the launcher: a thread records every descendant of this process
while the launch runs, and workers record their own pid and torchrun's in the run directory.
"""

import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from conftest import process_alive

from launch.processes.supervisor import torchrun

WORKER = Path(__file__).parent / "workers" / "fault_worker.py"
RUN_TIMEOUT = 120.0  # generous: other jobs may share the 2 cores
HANG_TIMEOUT = 15.0
SLACK = 10.0


@contextmanager
def _descendants_recorded():
    pids: set[int] = set()
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            pids.update(child.pid for child in psutil.Process().children(recursive=True))
            stop.wait(0.1)

    thread = threading.Thread(target=record, daemon=True)
    thread.start()
    try:
        yield pids
    finally:
        stop.set()
        thread.join()


pytestmark = pytest.mark.usefixtures("no_warm_pool")  # these tests watch every process this one starts


def _assert_nothing_left(run_dir: Path, recorded: set[int]) -> None:
    written = {int(pid) for path in run_dir.glob("pid_rank*") for pid in path.read_text().split()}
    assert recorded, "no descendant process was ever seen"
    assert not [pid for pid in recorded | written if process_alive(pid)], "processes outlived the launcher"


def _assert_both_ranks_started(run_dir: Path) -> None:
    assert sorted(path.name for path in run_dir.glob("pid_rank*")) == ["pid_rank0", "pid_rank1"]


def _launch(mode: str, run_dir: Path, timeout: float = RUN_TIMEOUT, on_line=None):
    started = time.monotonic()
    with _descendants_recorded() as recorded:
        result = torchrun(str(WORKER), 2, args=[mode], timeout=timeout, on_line=on_line, run_dir=run_dir)
    assert time.monotonic() - started < timeout + SLACK
    _assert_nothing_left(run_dir, recorded)
    return result


@pytest.mark.distributed
def test_success_streams_lines_attributed_to_their_rank(tmp_path):
    seen = []
    result = _launch("ok", tmp_path, on_line=lambda rank, line: seen.append((rank, line)))
    assert result.ok and result.returncode == 0 and not result.timed_out
    assert result.failed_rank is None and result.error is None
    _assert_both_ranks_started(tmp_path)  # so HYPER_PARALLEL_RUN_DIR reached the workers
    for rank, other in ((0, 1), (1, 0)):
        assert f"rank {rank} started" in result.logs[rank]
        assert f"rank {rank} sum 2" in result.logs[rank]  # a rank's last line is not lost
        assert not [line for line in result.logs[rank] if f"rank {other}" in line]
    assert {rank for rank, _ in seen} >= {0, 1}
    assert result.command[1:3] == ["-m", "launch.processes.local_agent"]
    assert result.run_dir == tmp_path.resolve()


@pytest.mark.distributed
def test_raising_rank_reports_its_traceback(tmp_path):
    result = _launch("raise", tmp_path)
    assert not result.ok and not result.timed_out and result.returncode != 0
    assert result.failed_rank == 1
    assert "Traceback (most recent call last):" in result.error
    assert "RuntimeError: injected failure on rank 1" in result.error
    _assert_both_ranks_started(tmp_path)


@pytest.mark.distributed
def test_sigkilled_rank_is_reported(tmp_path):
    result = _launch("sigkill", tmp_path)
    assert not result.ok and not result.timed_out
    assert result.failed_rank == 1  # not rank 0, which fails after it with gloo's "Connection reset by peer"
    assert "SIGKILL" in result.error and "while running" in result.error and "crashed at exit" not in result.error
    _assert_both_ranks_started(tmp_path)


@pytest.mark.distributed
def test_abort_after_the_work_finished_is_reported_as_a_crash_at_exit(tmp_path):
    """Rank 1 completes the all_reduce (sum 2 = 1 + 1, as on rank 0), then aborts in an exit handler."""
    result = _launch("abort_at_exit", tmp_path)
    assert not result.ok and result.failed_rank == 1
    assert "rank 1 sum 2" in result.logs[1]
    assert result.error.startswith("rank 1 crashed at exit: killed by SIGABRT")
    assert "rank 1 registers an abort at exit" in result.error  # the rank's last stderr lines are shown


@pytest.mark.distributed
def test_nonzero_exit_without_traceback_is_reported(tmp_path):
    result = _launch("exit", tmp_path)
    assert not result.ok and result.failed_rank == 1
    assert "exit code 3" in result.error and "no Python traceback" in result.error
    _assert_both_ranks_started(tmp_path)


@pytest.mark.distributed
def test_hang_in_collective_is_ended_at_the_timeout(tmp_path):
    arrivals = {}
    started = time.monotonic()
    result = _launch(
        "hang", tmp_path, timeout=HANG_TIMEOUT, on_line=lambda r, line: arrivals.setdefault(line, time.monotonic())
    )
    assert not result.ok and result.timed_out
    assert result.error.startswith("timed out after 15 s")
    if "rank 0 entering all_reduce" not in result.logs[0]:
        pytest.skip("machine too loaded: rank 0 did not reach the all_reduce within the 15 s timeout")
    _assert_both_ranks_started(tmp_path)
    assert arrivals["rank 0 entering all_reduce"] - started < HANG_TIMEOUT  # streamed while running
    assert result.failed_rank == 0  # the lowest rank still running at the deadline
    assert "in all_reduce" in result.error  # rank 0's stack dump at the deadline


@pytest.mark.distributed
def test_keyboard_interrupt_in_caller_ends_the_tree(tmp_path):
    ranks_started = set()

    def interrupt_once_both_ranks_run(rank, line):
        if line == f"rank {rank} started":
            ranks_started.add(rank)
        if ranks_started == {0, 1}:
            raise KeyboardInterrupt

    with _descendants_recorded() as recorded, pytest.raises(KeyboardInterrupt):
        torchrun(str(WORKER), 2, args=["ok"], on_line=interrupt_once_both_ranks_run, run_dir=tmp_path)
    _assert_nothing_left(tmp_path, recorded)
    _assert_both_ranks_started(tmp_path)


def test_bad_input_is_rejected_before_launching(tmp_path):
    with pytest.raises(ValueError, match="nproc must be a positive int"):
        torchrun(str(WORKER), 0, run_dir=tmp_path)
    with pytest.raises(ValueError, match="not found"):
        torchrun(str(tmp_path / "missing.py"), 2, run_dir=tmp_path)
    with pytest.raises(ValueError, match="sequence of strings"):
        torchrun(str(WORKER), 2, args="ok", run_dir=tmp_path)
