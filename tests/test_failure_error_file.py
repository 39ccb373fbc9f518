"""The failing rank and its traceback from torchrun's per-rank error file, the logs only without one.

A rank that raises records its exception in ``TORCHELASTIC_ERROR_FILE`` (``hyper_parallel.rank_lifetime``);
``launch.processes.failure_report`` reads those files first.  The launches reuse tests/workers/fault_worker.py:
rank 1 faults after ``init_process_group`` (its store barrier) while every other rank waits in an
all_reduce and then fails with gloo's "Connection closed by peer", writing an error file of its own.
The unit tests lay out a torchrun log directory by hand.
"""

import json
import os
import time
from pathlib import Path

import pytest

from launch.processes.failure_report import exit_of, failure, rank_errors, timeout_error
from launch.processes.supervisor import torchrun

WORKER = Path(__file__).parent / "workers" / "fault_worker.py"
RUN_TIMEOUT = 120.0
INJECTED = "injected failure on rank 1"
PEER_LOST = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4225."


def _error_file(log_dir: Path, rank: int, message: str, callstack: str, timestamp: int, attempt: int = 0) -> Path:
    """An error file as torch's ErrorHandler.record_exception writes it."""
    folder = log_dir / "run_id_xyz" / f"attempt_{attempt}" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "error.json"
    data = {"message": {"message": message, "extraInfo": {"py_callstack": callstack, "timestamp": str(timestamp)}}}
    path.write_text(json.dumps(data))
    return path


def _traceback(where: str, last: str) -> str:
    return f'Traceback (most recent call last):\n  File "{where}", line 7, in <module>\n    boom()\n{last}\n'


def _summary(*failed: tuple[int, int]) -> list[str]:
    """torchrun's failure summary naming ``failed`` (rank, exit code) pairs, the first as root cause."""
    lines = ["Failures:"]
    for rank, code in failed[1:]:
        lines += [f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: 1)"]
    lines += ["Root Cause (first observed failure):"]
    rank, code = failed[0]
    return [*lines, f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: 1)"]


def test_the_first_error_file_written_names_the_rank_and_gives_the_traceback(tmp_path):
    now = int(time.time())
    _error_file(tmp_path, 0, PEER_LOST, _traceback("worker.py", PEER_LOST), now + 1)
    cause = _error_file(tmp_path, 2, "KeyError: 'layer7'", _traceback("from_file.py", "KeyError: 'layer7'"), now)
    logs = {-1: _summary((0, 1), (2, 1)), 0: [], 2: ["Traceback (most recent call last):", "KeyError: 'logged'"]}
    report = failure(logs, {}, 1, tmp_path)
    assert report.rank == 2
    assert report.rank_error is not None and report.rank_error.path == cause
    assert (report.rank_error.exception, report.rank_error.message) == ("KeyError", "'layer7'")
    assert report.error.splitlines()[0] == "rank 2 failed: exit code 1"  # the format of the logs' report
    assert 'File "from_file.py", line 7, in <module>' in report.error  # the file's traceback, not the log's
    assert "logged" not in report.error


def test_within_one_second_the_file_written_first_wins_and_a_lost_peer_does_not(tmp_path):
    now = int(time.time())
    peer = _error_file(tmp_path, 0, PEER_LOST, _traceback("worker.py", PEER_LOST), now)
    cause = _error_file(tmp_path, 3, "ValueError: bad shard", _traceback("worker.py", "ValueError: bad shard"), now)
    os.utime(peer, ns=(10**18, 10**18))  # written first, but only lost its peer
    os.utime(cause, ns=(2 * 10**18, 2 * 10**18))
    other = _error_file(tmp_path, 1, "TypeError: later", _traceback("worker.py", "TypeError: later"), now)
    os.utime(other, ns=(3 * 10**18, 3 * 10**18))
    assert [error.rank for error in rank_errors(tmp_path)] == [0, 3, 1]
    report = failure({-1: _summary((0, 1), (1, 1), (3, 1))}, {}, 1, tmp_path)
    assert report.rank == 3 and report.rank_error.exception == "ValueError"


def test_only_the_latest_attempt_counts_and_unreadable_files_are_skipped(tmp_path):
    now = int(time.time())
    _error_file(tmp_path, 0, "OSError: old attempt", "", now - 100, attempt=0)
    _error_file(tmp_path, 1, "OSError: this attempt", "", now, attempt=1)
    broken = tmp_path / "run_id_xyz" / "attempt_1" / "0" / "error.json"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"message": {"mess')  # a rank killed while writing it
    assert [(e.rank, e.message) for e in rank_errors(tmp_path)] == [(1, "this attempt")]
    report = failure({-1: _summary((1, 1))}, {}, 1, tmp_path)
    assert report.error == "rank 1 failed: exit code 1\nOSError: this attempt"  # no traceback in the file


def test_a_later_attempt_without_files_does_not_reuse_an_earlier_attempts(tmp_path):
    now = int(time.time())
    _error_file(tmp_path, 0, "OSError: old attempt", "", now - 100, attempt=0)
    (tmp_path / "run_id_xyz" / "attempt_1" / "1").mkdir(parents=True)  # this attempt: rank 1 was killed
    assert rank_errors(tmp_path) == []
    report = failure({-1: _summary((1, -9)), 1: ["rank 1 started"]}, {1: ["rank 1 started"]}, 1, tmp_path)
    assert report.rank == 1 and report.rank_error is None


def test_a_root_cause_killed_by_a_signal_beats_an_error_file_that_is_not_a_known_lost_peer(tmp_path):
    """NCCL-style follow-on errors are not in PEER_LOSS: the rank that only noticed must not be blamed."""
    now = int(time.time())
    _error_file(tmp_path, 0, "RuntimeError: NCCL communicator was aborted", _traceback("w.py", "RuntimeError"), now)
    logs = {-1: _summary((1, -9), (0, 1)), 0: [], 1: ["rank 1 started"]}
    report = failure(logs, {1: ["rank 1 started"]}, 1, tmp_path)
    assert report.rank == 1 and report.rank_error is None
    assert report.error.startswith("rank 1 failed: killed by SIGKILL (exit code -9) while running")


def test_without_an_error_file_the_logs_name_the_rank(tmp_path):
    logs = {-1: _summary((1, -9), (0, 1)), 0: [], 1: ["rank 1 started"]}
    report = failure(logs, {1: ["rank 1 started"]}, 1, tmp_path)
    assert report.rank == 1 and report.rank_error is None
    assert report.error.startswith("rank 1 failed: killed by SIGKILL (exit code -9) while running")


@pytest.mark.distributed
@pytest.mark.usefixtures("no_warm_pool")
@pytest.mark.parametrize("nproc", [2, 4])
def test_a_raising_rank_is_named_from_its_error_file(tmp_path, nproc):
    result = torchrun(str(WORKER), nproc, args=["raise"], timeout=RUN_TIMEOUT, run_dir=tmp_path)
    assert not result.ok and not result.timed_out
    assert result.failed_rank == 1
    rank_error = result.rank_error
    assert rank_error is not None, f"the error did not come from an error file:\n{result.error}"
    assert (rank_error.rank, rank_error.exception, rank_error.message) == (1, "RuntimeError", INJECTED)
    assert rank_error.path.match(f"{tmp_path}/torchrun_logs_*/*/attempt_*/*/error.json")  # torchrun's own layout
    assert rank_error.path.parent.name == "1" and rank_error.path.parent.parent.name == "attempt_0"
    recorded = json.loads(rank_error.path.read_text())["message"]["extraInfo"]["py_callstack"]
    assert result.error == "\n".join(["rank 1 failed: exit code 1", *recorded.splitlines()])
    assert f'raise RuntimeError("{INJECTED}")' in result.error
    assert result.error.endswith(f"RuntimeError: {INJECTED}")
    # the ranks left waiting in the all_reduce may write files too (gloo's lost peer), and are not blamed
    recorded_errors = rank_errors(rank_error.path.parents[3])  # torchrun's --log-dir
    assert recorded_errors[0].rank == 1  # rank 1's file was written before its peers noticed it was gone
    others = [error for error in recorded_errors if error.rank != 1]
    assert all(error.lost_a_peer for error in others), [error.message for error in others]


@pytest.mark.distributed
@pytest.mark.usefixtures("no_warm_pool")
def test_a_sigkilled_rank_without_an_error_file_is_named_from_the_logs(tmp_path):
    result = torchrun(str(WORKER), 2, args=["sigkill"], timeout=RUN_TIMEOUT, run_dir=tmp_path)
    assert not result.ok and not result.timed_out
    assert result.failed_rank == 1 and result.rank_error is None
    assert "SIGKILL" in result.error and "while running" in result.error
    log_dir = next(tmp_path.glob("torchrun_logs_*"))
    assert not list(log_dir.glob("*/attempt_*/1/error.json"))  # a killed rank writes none
    assert all(error.lost_a_peer for error in rank_errors(log_dir))  # rank 0's, if any: only its lost peer


def test_a_timeout_before_any_rank_started_says_so_instead_of_an_empty_list():
    message = timeout_error({-1: ["torchrun starting"]}, [], 15)
    assert message.startswith("timed out after 15 s before any rank had started") and "[]" not in message


def test_how_a_rank_ended_is_read_from_torchruns_failure_summary():
    summary = [
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 4242)",
    ]
    assert exit_of(summary, 1) == "killed by SIGKILL (exit code -9)"
    assert exit_of(summary, 0) is None
