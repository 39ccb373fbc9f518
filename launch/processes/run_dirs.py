"""Where a launch writes: a directory that no concurrent launch shares, and scratch that is cleaned.

* A launch *claims* its run directory for its duration (an exclusive ``flock`` on
  ``.launch.lock`` inside it): a second launch into the same directory at the same time fails
  at once with a clear error instead of mixing two runs' logs, traces and metrics.
* A launch given no directory gets a fresh one under one scratch folder per user,
  ``$TMPDIR/hyper-parallel-<uid>/`` (``HYPER_PARALLEL_SCRATCH`` overrides it).  Its name is
  predictable, so on a shared host another user could create it first and then swap run folders
  (forged ``metrics.json``) or plant symlinks: it is created 0700 and refused unless it is a real
  directory owned by this user that neither group nor others can write.  The run's
  result keeps pointing at it (reports and figures read it later), so it is not deleted when
  the launch ends; instead every new scratch directory prunes the old ones: those untouched
  for ``MAX_AGE_SECONDS`` and all but the newest ``MAX_KEPT``, never one a launch still claims.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCRATCH_ENV = "HYPER_PARALLEL_SCRATCH"
LOCK_FILE = ".launch.lock"
MAX_AGE_SECONDS = 24 * 3600
MAX_KEPT = 100


class RunDirError(RuntimeError):
    """A run folder that cannot be used: claimed by a running launch, or a scratch root that is not private."""


def scratch_root() -> Path:
    """This user's private scratch folder (created 0700); ``RunDirError`` if it is not private."""
    root = Path(os.environ.get(SCRATCH_ENV) or Path(tempfile.gettempdir()) / f"hyper-parallel-{os.getuid()}")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(root)
    return root


def check_private(root: Path) -> None:
    """``root`` is a directory (not a symlink) owned by this user, writable by nobody else."""
    info = os.lstat(root)
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    elif info.st_uid != os.getuid():
        problem = f"is owned by uid {info.st_uid}, not by you (uid {os.getuid()})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = (
            f"is writable by {'others' if info.st_mode & stat.S_IWOTH else 'its group'} (mode {info.st_mode & 0o777:o})"
        )
    if problem:
        raise RunDirError(
            f"the scratch folder {root} {problem}: another user could replace run folders in it. Remove it "
            f"if it is yours (rm -r {root}), or set {SCRATCH_ENV} to a private folder of yours"
        )


def new_scratch_dir(prefix: str) -> Path:
    """A fresh directory for one launch under ``scratch_root()``; prunes old ones first."""
    root = scratch_root()
    prune(root)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def _in_use(directory: Path) -> bool:
    lock = directory / LOCK_FILE
    if not lock.exists():
        return False
    try:
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # vanished meanwhile: its launch has ended
    return False


def prune(root: Path, max_age: float = MAX_AGE_SECONDS, max_kept: int = MAX_KEPT) -> list[Path]:
    """Delete run directories in ``root`` older than ``max_age`` seconds or beyond the newest
    ``max_kept``, except those a launch claims now; returns what was deleted."""
    entries = []
    for entry in root.iterdir():
        try:
            if entry.is_dir() and not entry.is_symlink():
                entries.append((entry.stat().st_mtime, entry))
        except OSError:
            continue
    entries.sort(reverse=True)
    now, removed = time.time(), []
    for index, (mtime, entry) in enumerate(entries):
        if (index >= max_kept or now - mtime > max_age) and not _in_use(entry):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


@contextmanager
def claimed(run_dir: Path) -> Iterator[Path]:
    """Hold ``run_dir`` for one launch; ``RunDirError`` if another launch holds it now."""
    lock_path = run_dir / LOCK_FILE
    handle = open(lock_path, "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RunDirError(
            f"{run_dir} is being written by another launch that is still running; give each "
            f"concurrent launch its own directory (out=... / run_dir=...), or leave it unset "
            f"for a fresh one"
        ) from None
    try:
        os.utime(run_dir)  # a claimed directory counts as recent for pruning
        yield run_dir
    finally:
        handle.close()  # the lock file stays: unlinking it would let two launches lock two different files
