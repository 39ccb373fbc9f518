"""Why a launch failed, in words: which rank to blame, how it ended, and the lines that show it.

Read from torchrun's own summary (its ``Failures:``/``Root Cause`` sections give each failed
rank's exit code), each rank's output, and the files ranks write when their work has finished
(``hyper_parallel.rank_lifetime``).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from hyper_parallel.rank_lifetime import FINISHED_FILE

MAX_ERROR_LINES = 60
STDERR_TAIL_LINES = 15
TRACEBACK_HEADER = "Traceback (most recent call last):"
CHAINED_TRACEBACK = ("During handling of the above exception", "The above exception was the direct cause")
FAILURES_MARKER = "Failures:"
ROOT_CAUSE_MARKER = "Root Cause (first observed failure)"
FIELD_RE = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)")
PEER_LOSS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
"""gloo's errors on a rank whose peer went away: a consequence of another rank's failure."""


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


def _lost_a_peer(lines: list[str]) -> bool:
    return any(marker in line for line in error_lines(lines) for marker in PEER_LOSS)


def failure(
    logs: dict[int, list[str]], stderr: dict[int, list[str]], returncode: int, status_dir: Path
) -> tuple[int, str]:
    """The rank to blame and the error text.

    The rank is torchrun's root cause, unless that rank only lost a peer (gloo's connection
    errors) while another failed rank did not: torchrun's timestamps have one-second
    resolution, so a rank failing because its peer died can be named first.  A rank killed by
    a signal (the supervisor sends none before torchrun exits on its own) is told apart by
    whether it had recorded the end of its work: then it crashed at exit.
    """
    codes, root = _torchrun_failures(logs[-1])
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


def timeout_error(logs: dict[int, list[str]], ranks: list[int], timeout: float) -> str:
    parts = [f"timed out after {timeout:g} s; ranks still running: {ranks} (their stacks at the deadline follow)"]
    for rank in ranks:
        parts += [f"--- rank {rank} ---", *(error_lines(logs.get(rank, [])) or ["(no stack dump)"])]
    return "\n".join(parts)
