"""Where a launch writes: a directory that no concurrent launch shares, and scratch that is cleaned.

* A launch *claims* its run directory for its duration (an exclusive ``flock`` on
  ``.launch.lock`` inside it): a second launch into the same directory at the same time fails
  at once with a clear error instead of mixing two runs' logs, traces and metrics.
* Every folder a run writes is a real directory of this user's that nobody else can write
  (``make_run_dir``, the scratch root's rule): another user could otherwise plant a symbolic link
  under a file's name and have the run overwrite a file of yours through it. Files are written
  whole or not at all, never through a link (``hyper_parallel.run_files.write_atomic``).
* A run folder is complete or says it is not: ``begin_run`` removes everything an earlier run left
  in it (results, figures, report, logs) and leaves an ``INCOMPLETE`` note that ``finish_run``
  removes once the launcher has written ``summary.json``; a folder still holding the note was
  interrupted (or is being written), whatever its other files say.
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

import datetime
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hyper_parallel.run_files import (
    BATCH_FILE,
    CHROME_TRACE_FILE,
    FIGURE_FILES,
    METRICS_FILE,
    NO_SPACE,
    REPORT_FILE,
    SUMMARY_FILE,
    TRACE_FILE,
    no_space,
    write_atomic,
)
from launch.processes.log_layout import LOG_DIR_GLOB

SCRATCH_ENV = "HYPER_PARALLEL_SCRATCH"
LOCK_FILE = ".launch.lock"
INCOMPLETE_FILE = "INCOMPLETE"
MAX_AGE_SECONDS = 24 * 3600
MAX_KEPT = 100
RUN_OUTPUTS = (
    METRICS_FILE,
    SUMMARY_FILE,
    TRACE_FILE.format(rank="*"),
    CHROME_TRACE_FILE,
    BATCH_FILE,
    REPORT_FILE,
    ".*.partial",
)
"""What a run leaves in its folder (``hyper_parallel.run_files``), as patterns; besides its figures and logs."""


class RunDirError(RuntimeError):
    """A run folder that cannot be used: claimed by a running launch, or one another user could write into."""


def scratch_root() -> Path:
    """This user's private scratch folder (created 0700); ``RunDirError`` if it is not private."""
    root = Path(os.environ.get(SCRATCH_ENV) or Path(tempfile.gettempdir()) / f"hyper-parallel-{os.getuid()}")
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise RunDirError(
            f"the scratch folder {root} cannot be created ({error.strerror}); set {SCRATCH_ENV} to a folder of yours"
        ) from None
    check_private(root)
    return root


def _not_private(path: Path) -> str | None:
    """Why ``path`` is not a real directory of this user's that nobody else can write (None: it is)."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.getuid():
        return f"is owned by uid {info.st_uid}, not by you (uid {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if info.st_mode & stat.S_IWOTH else "its group"
        return f"is writable by {who} (mode {info.st_mode & 0o777:o})"
    return None


def check_private(root: Path) -> None:
    """``root`` is a directory (not a symlink) owned by this user, writable by nobody else."""
    if problem := _not_private(root):
        raise RunDirError(
            f"the scratch folder {root} {problem}: another user could replace run folders in it. Remove it "
            f"if it is yours (rm -r {root}), or set {SCRATCH_ENV} to a private folder of yours"
        )


def make_run_dir(path: str | os.PathLike) -> Path:
    """The folder a run writes into, created if absent (never writable by group or others); ``ValueError``
    when it cannot be created, ``RunDirError`` when another user could write into it."""
    path = Path(path).expanduser().absolute()
    try:
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        problem = _not_private(path)
    except OSError as error:
        if error.errno in NO_SPACE:
            raise no_space(path.parent, error) from None
        raise ValueError(
            f"cannot create the run directory {path}: {error.strerror}; choose another out= / --out"
        ) from None
    if problem:
        raise RunDirError(
            f"the run directory {path} {problem}: another user could plant links in it and have the run "
            f"overwrite your files through them. Choose a folder of yours (or chmod go-w {path})"
        )
    return path


def begin_run(run_dir: Path) -> None:
    """Remove what an earlier run left in the claimed ``run_dir`` and mark it incomplete until ``finish_run``."""
    for pattern in (*RUN_OUTPUTS, *_figure_files(run_dir)):
        for stale in run_dir.glob(pattern):
            if stale.is_file() or stale.is_symlink():
                stale.unlink(missing_ok=True)
    for log_dir in run_dir.glob(LOG_DIR_GLOB):
        if log_dir.is_dir() and not log_dir.is_symlink():
            shutil.rmtree(log_dir, ignore_errors=True)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    write_atomic(
        run_dir / INCOMPLETE_FILE,
        f"A launch started writing this run at {started} and has not finished it. If no launch is running, "
        f"it was interrupted: its files may be partial. Run it again.\n",
    )


def _figure_files(run_dir: Path) -> list[str]:
    """The run figures' file names, when ``run_dir`` holds any image (the registry imports matplotlib)."""
    if not any(run_dir.glob("*.png")) and not any(run_dir.glob("*.svg")):
        return []
    from hyper_parallel.viz.figure_registry import FIGURES

    return [pattern.format(name=name) for name in FIGURES for pattern in FIGURE_FILES]


def finish_run(run_dir: Path) -> None:
    """The run's ``summary.json`` is written: the folder is complete."""
    (run_dir / INCOMPLETE_FILE).unlink(missing_ok=True)


def is_incomplete(run_dir: Path) -> bool:
    return (run_dir / INCOMPLETE_FILE).exists()


def new_scratch_dir(prefix: str) -> Path:
    """A fresh directory for one launch under ``scratch_root()``; prunes old ones first."""
    root = scratch_root()
    prune(root)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def _open_lock(directory: Path) -> int:
    """The claim's lock file, created if absent; never through a symbolic link (``OSError`` then)."""
    return os.open(directory / LOCK_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)


def _in_use(directory: Path) -> bool:
    if not (directory / LOCK_FILE).exists():
        return False
    try:
        handle = _open_lock(directory)
    except OSError:
        return False  # vanished meanwhile: its launch has ended
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)
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
    try:
        handle = _open_lock(run_dir)
    except OSError as error:
        raise RunDirError(
            f"cannot claim {run_dir}: {run_dir / LOCK_FILE} cannot be opened ({error.strerror}); "
            f"a symbolic link there is refused. Remove it, or choose another folder"
        ) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(handle)
        raise RunDirError(
            f"{run_dir} is being written by another launch that is still running; give each "
            f"concurrent launch its own directory (out=... / run_dir=...), or leave it unset "
            f"for a fresh one"
        ) from None
    try:
        os.utime(run_dir)  # a claimed directory counts as recent for pruning
        yield run_dir
    finally:
        os.close(handle)  # the lock file stays: unlinking it would let two launches lock two different files
