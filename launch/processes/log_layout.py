"""Where each rank's logs and error file live: torchrun's ``--log-dir`` layout, the one home of its spelling.

    <run dir>/torchrun_logs_XXXX/<torchrun run id>/attempt_<N>/<rank>/{stdout.log, stderr.log, error.json}

A fresh launch gets it from torchrun (``--log-dir``, ``--redirects 3``); a warm-pool run writes the same
tree itself (``write_pool_logs``), so the report and the failure report read every run one way.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from hyper_parallel.rank_lifetime import ERROR_FILE

LOG_DIR_PREFIX = "torchrun_logs_"
LOG_DIR_GLOB = f"{LOG_DIR_PREFIX}*"
ATTEMPT_PREFIX = "attempt_"
STDOUT_LOG, STDERR_LOG = "stdout.log", "stderr.log"
POOL_RUN_ID = "pool"  # the run-id folder of a warm-pool run's logs


def new_log_dir(run_dir: Path) -> Path:
    """A fresh log directory inside ``run_dir`` (its mtime is the launch's start: ``report`` relies on it)."""
    return Path(tempfile.mkdtemp(prefix=LOG_DIR_PREFIX, dir=run_dir))


def log_dirs(directory: Path) -> list[Path]:
    """The log directories directly inside ``directory``, in name order."""
    return sorted(path for path in directory.glob(LOG_DIR_GLOB) if path.is_dir())


def _attempt_number(folder: Path) -> int | None:
    number = folder.name.removeprefix(ATTEMPT_PREFIX)
    return int(number) if folder.name.startswith(ATTEMPT_PREFIX) and number.isdigit() else None


def latest_attempt(log_dir: Path) -> Path | None:
    """The folder of the last attempt (a restarted job's earlier attempts describe runs that are over)."""
    attempts = [
        (n, folder)
        for folder in Path(log_dir).glob(f"*/{ATTEMPT_PREFIX}*")
        if (n := _attempt_number(folder)) is not None
    ]
    return max(attempts)[1] if attempts else None


def rank_log_files(log_dir: Path) -> Iterator[tuple[int, Path]]:
    """(rank, path) of every ``stdout.log`` / ``stderr.log`` of every attempt, in path order."""
    for path in sorted(Path(log_dir).glob(f"*/{ATTEMPT_PREFIX}*/*/std*.log")):
        if path.parent.name.isdigit() and path.name in (STDOUT_LOG, STDERR_LOG):
            yield int(path.parent.name), path


def rank_error_files(attempt: Path) -> list[Path]:
    """The ``error.json`` files the ranks of one attempt wrote (torch's ``@record`` format)."""
    return [path for path in attempt.glob(f"*/{ERROR_FILE}") if path.parent.name.isdigit()]


def write_pool_logs(run_dir: Path, logs: Mapping[int, list[str]], world_size: int) -> Path:
    """A warm-pool run's lines of every rank, written as a fresh launch's log tree; returns its directory."""
    log_dir = new_log_dir(run_dir)
    for rank in range(world_size):
        folder = log_dir / POOL_RUN_ID / f"{ATTEMPT_PREFIX}0" / str(rank)
        folder.mkdir(parents=True)
        (folder / STDOUT_LOG).write_text("".join(f"{line}\n" for line in logs.get(rank, [])))
    return log_dir
