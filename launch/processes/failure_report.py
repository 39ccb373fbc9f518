"""Why a launch failed, in words: which rank to blame, how it ended, and the lines that show it.

First from the error files: a rank that raises records its exception (type, message, traceback,
time) in the JSON file torchrun's agent gave it (``hyper_parallel.rank_lifetime.record_error``, torch's
``@record`` format); the first one written names the rank.  Without one (a rank killed by a signal,
exiting with a code, hanging) from torchrun's own summary (its ``Failures:``/``Root Cause`` sections
give each failed rank's exit code), each rank's output, and the files ranks write when their work has
finished (``hyper_parallel.rank_lifetime``).
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from hyper_parallel.rank_lifetime import FINISHED_FILE
from launch.processes.log_layout import latest_attempt, rank_error_files

MAX_ERROR_LINES = 60
STDERR_TAIL_LINES = 15
TRACEBACK_HEADER = "Traceback (most recent call last):"
CHAINED_TRACEBACK = ("During handling of the above exception", "The above exception was the direct cause")
FAILURES_MARKER = "Failures:"
ROOT_CAUSE_MARKER = "Root Cause (first observed failure)"
FIELD_RE = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)")
PEER_LOSS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
"""gloo's errors on a rank whose peer went away: a consequence of another rank's failure."""


@dataclass(frozen=True)
class RankError:
    """A rank's uncaught exception as its error file (torchrun's ``TORCHELASTIC_ERROR_FILE``) has it."""

    rank: int
    """The folder torchrun wrote the file in: the local rank, which is the global rank on our one node."""
    exception: str
    """The exception's type, e.g. ``RuntimeError`` (``<N/A>`` when the file gives no type)."""
    message: str
    """The exception's text (``str(error)``)."""
    traceback: list[str]
    """Its Python traceback, the lines ``traceback.format_exc()`` gave (empty when the file has none)."""
    timestamp: int
    """When it was written (seconds since the epoch: torch records whole seconds)."""
    path: Path

    @property
    def lost_a_peer(self) -> bool:
        """gloo's error on a rank whose peer went away first: a consequence, not the cause."""
        return _names_a_lost_peer((self.message, *self.traceback))


@dataclass(frozen=True)
class Failure:
    """The rank to blame (-1: none), the error text shown to the user, and the error file it came from."""

    rank: int
    error: str
    rank_error: RankError | None = None
    """The blamed rank's error file; None when the text came from torchrun's summary and the logs."""


def error_lines(lines: list[str]) -> list[str]:
    """The last (possibly chained) Python traceback in ``lines``, else a faulthandler stack dump."""
    starts = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK_HEADER]
    if starts:
        begin = starts[-1]
        for previous in reversed(starts[:-1]):
            if not any(line.startswith(CHAINED_TRACEBACK) for line in lines[previous:begin]):
                break
            begin = previous
        return lines[begin:][-MAX_ERROR_LINES:]
    dumps = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error:")]
    stack = []
    for line in lines[dumps[-1] :] if dumps else []:
        if line.startswith("Extension modules:"):
            break
        if "<frozen importlib." not in line:
            stack.append(line)
    return stack[:MAX_ERROR_LINES]


def describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name} (exit code {code})"
    except ValueError:
        return f"killed by signal {-code}"


def _torchrun_failures(torchrun_lines: list[str]) -> tuple[dict[int, int], int | None]:
    """Every failed rank's exit code in torchrun's summary, and the rank it names as root cause."""
    markers = [i for i, line in enumerate(torchrun_lines) if FAILURES_MARKER in line or ROOT_CAUSE_MARKER in line]
    codes: dict[int, int] = {}
    root, rank, in_root = None, None, False
    for line in torchrun_lines[markers[0] :] if markers else []:
        in_root = in_root or ROOT_CAUSE_MARKER in line
        match = FIELD_RE.match(line)
        if match and match[1] == "rank":
            rank = int(match[2])
            root = rank if in_root and root is None else root
        elif match and rank is not None:
            codes.setdefault(rank, int(match[2]))
    return codes, root


def _names_a_lost_peer(lines) -> bool:
    return any(marker in line for line in lines for marker in PEER_LOSS)


def _lost_a_peer(lines: list[str]) -> bool:
    """Whether a rank's output ends in gloo's error for a peer that went away (``PEER_LOSS``)."""
    return _names_a_lost_peer(error_lines(lines))


def _read_error_file(path: Path) -> tuple[RankError, int] | None:
    """The exception in one error file and the file's write time (ns); None if it is not torch's JSON."""
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        written = path.stat().st_mtime_ns
        message = data["message"]
        if isinstance(message, str):  # torch's other layout: {"message": "...", "timestamp": ...}
            text, extra = message, {"timestamp": data.get("timestamp", 0)}
        else:
            text, extra = str(message.get("message", "")), message.get("extraInfo") or {}
        timestamp = int(extra.get("timestamp", 0))
        callstack = str(extra.get("py_callstack", ""))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # unreadable, half written (the rank was killed while writing it) or not torch's
    exception, sep, text_only = text.partition(": ")
    if not sep or " " in exception:
        exception, text_only = "<N/A>", text
    rank_error = RankError(
        rank=int(path.parent.name),
        exception=exception,
        message=text_only,
        traceback=callstack.splitlines() if callstack.strip() not in ("", "NoneType: None") else [],
        timestamp=timestamp,
        path=path,
    )
    return rank_error, written


def rank_errors(log_dir: Path) -> list[RankError]:
    """The error files of the latest attempt under torchrun's ``log_dir``, first written first.

    Ordered by the timestamp in the file, then by the file's own write time (torch's timestamp has
    one-second resolution; the peer of a failing rank often fails within the same second).
    """
    latest = latest_attempt(log_dir)
    if latest is None:
        return []
    read = [_read_error_file(path) for path in rank_error_files(latest)]
    ordered = sorted((entry for entry in read if entry is not None), key=lambda e: (e[0].timestamp, e[1], e[0].rank))
    return [rank_error for rank_error, _ in ordered]


def _blamed_error(
    errors: list[RankError], codes: dict[int, int], root: int | None, logs: dict[int, list[str]]
) -> RankError | None:
    """The first recorded exception that is not a lost peer; None when a rank without an error file
    (killed, exited with a code) is the likelier cause: then the logs decide. A rank killed by a signal
    that torchrun names as its root cause wins over any file: it cannot write one, and a backend whose
    follow-on errors are not in ``PEER_LOSS`` would otherwise blame the rank that only noticed it."""
    recorded = {error.rank for error in errors}
    if root is not None and root not in recorded and codes.get(root, 0) < 0:
        return None
    causes = [error for error in errors if not error.lost_a_peer]
    if causes:
        return causes[0]
    silent = [rank for rank in codes if rank not in recorded and not _lost_a_peer(logs.get(rank, []))]
    return None if silent or not errors else errors[0]


def _from_error_file(rank_error: RankError, code: int) -> Failure:
    """The failure message of a rank that recorded its exception: the traceback from its error file."""
    detail = rank_error.traceback[-MAX_ERROR_LINES:] or [f"{rank_error.exception}: {rank_error.message}"]
    header = f"rank {rank_error.rank} failed: {describe_exit(code)}"
    if code < 0:
        header += " while running (before its work finished)"
    return Failure(rank_error.rank, "\n".join([header, *detail]), rank_error)


def failure(logs: dict[int, list[str]], stderr: dict[int, list[str]], returncode: int, status_dir: Path) -> Failure:
    """The rank to blame and the error text.

    A rank that recorded its exception in its error file (``rank_errors``) is blamed first: the
    first one written, unless it only lost a peer (gloo's connection errors) while another rank
    did not, then with the traceback from its file.  Without such a file, the rank is torchrun's
    root cause, unless that rank only lost a peer while another failed rank did not: torchrun's
    timestamps have one-second resolution, so a rank failing because its peer died can be named
    first.  A rank killed by a signal (the supervisor sends none before torchrun exits on its own)
    is told apart by whether it had recorded the end of its work: then it crashed at exit.
    """
    codes, root = _torchrun_failures(logs[-1])
    rank_error = _blamed_error(rank_errors(status_dir), codes, root, logs)
    if rank_error is not None:
        return _from_error_file(rank_error, codes.get(rank_error.rank, returncode))
    return Failure(*_from_logs(logs, stderr, returncode, status_dir, codes, root))


def _from_logs(
    logs: dict[int, list[str]],
    stderr: dict[int, list[str]],
    returncode: int,
    status_dir: Path,
    codes: dict[int, int],
    root: int | None,
) -> tuple[int, str]:
    """The rank to blame and the error text from torchrun's summary and the ranks' output."""
    if root is None:
        with_traceback = [rank for rank in sorted(logs) if rank >= 0 and error_lines(logs[rank])]
        if not with_traceback:
            tail = "\n".join(logs[-1][-20:]) or "(none)"
            return -1, f"torchrun failed, {describe_exit(returncode)}, without naming a rank; its last output:\n{tail}"
        root = with_traceback[0]
    if _lost_a_peer(logs.get(root, [])):
        causes = [rank for rank in sorted(codes) if rank != root and not _lost_a_peer(logs.get(rank, []))]
        root = causes[0] if causes else root
    lines, code = logs.get(root, []), codes.get(root, returncode)
    tail = stderr.get(root, [])[-STDERR_TAIL_LINES:] or ["(none)"]
    finished = status_dir / FINISHED_FILE.format(rank=root)
    if code < 0 and finished.exists():
        return root, "\n".join(
            [
                f"rank {root} crashed at exit: {describe_exit(code)} after its work had finished "
                f"(it was leaving with exit code {finished.read_text()}); its last stderr lines:",
                *tail,
            ]
        )
    if code < 0:
        detail = error_lines(lines) or ["no Python traceback; its last stderr lines:", *tail]
        return root, "\n".join(
            [f"rank {root} failed: {describe_exit(code)} while running (before its work finished)", *detail]
        )
    detail = error_lines(lines) or ["no Python traceback; last output lines:", *lines[-10:]]
    return root, "\n".join([f"rank {root} failed: {describe_exit(code)}", *detail])


def exit_of(torchrun_lines: list[str], rank: int) -> str | None:
    """How ``rank`` ended by torchrun's failure summary ("killed by SIGKILL (exit code -9)"); None if not there."""
    code = _torchrun_failures(torchrun_lines)[0].get(rank)
    return None if code is None else describe_exit(code)


def timeout_error(logs: dict[int, list[str]], ranks: list[int], timeout: float) -> str:
    if not ranks:
        return (
            f"timed out after {timeout:g} s before any rank had started (torchrun was still starting its "
            f"workers: the machine may be overloaded, see `uptime`); give more time (--timeout / timeout=)"
        )
    parts = [f"timed out after {timeout:g} s; ranks still running: {ranks} (their stacks at the deadline follow)"]
    for rank in ranks:
        parts += [f"--- rank {rank} ---", *(error_lines(logs.get(rank, [])) or ["(no stack dump)"])]
    return "\n".join(parts)
