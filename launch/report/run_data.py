"""Everything a report shows about one run directory, read from its files without importing torch.

A report is most often wanted for a run that went wrong, so nothing here assumes success: a run
directory needs only one of summary.json, metrics.json or a trace file; missing pieces are left
empty and the page says so. The per-rank logs are torchrun's ``--log-dir`` files, which the
supervisor puts in the launch's directory: the run directory itself for ``launch.run``, its parent
(next to ``batch.json``) when several runs shared one launch (``run_many``, the notebooks).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyper_parallel.recipes import registry
from hyper_parallel.run_files import BATCH_FILE, METRICS_FILE, SUMMARY_FILE, TRACE_FILE
from launch.processes.log_layout import log_dirs, rank_log_files
from launch.processes.run_dirs import INCOMPLETE_FILE, is_incomplete

MAX_LOG_LINES = 2000  # per log file; the tail is kept (a traceback is at the end)
FAILED_RANK_RE = re.compile(r"^rank (\d+) failed")


@dataclass
class LogFile:
    """One rank's stdout or stderr (or torchrun's own output, rank -1), possibly cut to its tail."""

    rank: int
    stream: str
    lines: list[str]
    omitted: int = 0  # lines before the kept tail
    path: Path | None = None


@dataclass
class RunData:
    run_dir: Path
    summary: dict[str, Any]
    metrics: dict[str, Any]
    trace_ranks: list[int]
    logs: list[LogFile] = field(default_factory=list)
    chrome_traces: list[str] = field(default_factory=list)
    incomplete: bool = False
    """The launcher started this run and never finished it (``INCOMPLETE`` is still there)."""

    @property
    def recipe_name(self) -> str | None:
        return self.summary.get("recipe") or self.metrics.get("recipe")

    @property
    def recipe(self) -> registry.Recipe | None:
        """The recipe's registry entry, or None when the name is missing or no longer known."""
        try:
            return registry.get(self.recipe_name) if self.recipe_name else None
        except ValueError:
            return None

    @property
    def degrees(self) -> dict[str, int]:
        return dict(self.summary.get("degrees") or self.metrics.get("degrees") or {})

    @property
    def ok(self) -> bool:
        """The launcher's verdict (workers exited cleanly and matched the reference); the workers' own
        (metrics.json) only for a run no launcher of ours started (a multi-node torchrun), never for one it
        left unfinished."""
        if self.incomplete:
            return False
        if "ok" in self.summary:
            return bool(self.summary["ok"])
        return bool(self.metrics.get("ok"))

    @property
    def verdict(self) -> str:
        """PASSED, FAILED, or INCOMPLETE for a run its launcher did not finish."""
        return "INCOMPLETE" if self.incomplete else "PASSED" if self.ok else "FAILED"

    @property
    def error(self) -> str | None:
        if self.incomplete:
            return (
                f"incomplete: the launch that wrote this folder did not finish it ({INCOMPLETE_FILE} is still "
                f"there): interrupted, or still running. Its files may be partial; run it again"
            )
        if self.summary.get("error"):
            return str(self.summary["error"])
        if not self.ok and not self.summary:
            return f"no {SUMMARY_FILE}: the launcher did not finish this run (interrupted, or still running)"
        return None

    @property
    def failed_rank(self) -> int | None:
        match = FAILED_RANK_RE.match(self.error or "")
        return int(match[1]) if match else None

    def value(self, key: str, default: Any = None) -> Any:
        """A number both files may hold; metrics.json (the workers' own) first."""
        if key in self.metrics:
            return self.metrics[key]
        return self.summary.get(key, default)

    @property
    def finished_at(self) -> datetime.datetime | None:
        for name in (SUMMARY_FILE, METRICS_FILE):
            path = self.run_dir / name
            if path.exists():
                return datetime.datetime.fromtimestamp(path.stat().st_mtime)
        return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise ValueError(
            f"{path} is not valid JSON ({reason}); was the run interrupted while writing it? "
            f"Re-run it, or remove the file to report on the rest"
        ) from None
    if not isinstance(payload, dict):
        raise ValueError(f"{path} holds a {type(payload).__name__}, not the JSON object a run writes")
    degrees = payload.get("degrees")
    if degrees is not None and not (
        isinstance(degrees, dict) and all(isinstance(v, int) and not isinstance(v, bool) for v in degrees.values())
    ):
        raise ValueError(
            f"{path}: 'degrees' must be an object of whole numbers such as {{'dp_shard': 2}}, got {degrees!r}"
        )
    return payload


def _check_run_dir(run_dir: Path) -> None:
    if not run_dir.exists():
        raise ValueError(
            f"run directory {run_dir} does not exist; pass the folder given to "
            "`python -m launch run ... --out DIR` (printed as 'run directory:' at the end of a run)"
        )
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} is a file, not a run directory; pass the folder holding {SUMMARY_FILE}")
    markers = [run_dir / SUMMARY_FILE, run_dir / METRICS_FILE, *run_dir.glob(TRACE_FILE.format(rank="*"))]
    if any(path.exists() for path in markers):
        return
    inner = sorted(p.parent.name for p in run_dir.glob(f"*/{SUMMARY_FILE}"))
    listed = ", ".join(inner[:8]) + (f" and {len(inner) - 8} more" if len(inner) > 8 else "")
    hint = (
        f"; it holds the run directories {listed}: pass one of them"
        if inner
        else f"; a run directory holds {SUMMARY_FILE}, {METRICS_FILE} and trace_rank*.json"
    )
    raise ValueError(f"{run_dir} is not a run directory: it has no {SUMMARY_FILE}, {METRICS_FILE} or trace files{hint}")


def _launch_log_dir(run_dir: Path) -> Path | None:
    """The torchrun log directory of the launch that produced ``run_dir``.

    Several launches can share a parent (one per world size in a notebook): each log directory's
    mtime is its launch's start, so the right one is the latest started before the run's summary.
    """
    candidates = log_dirs(run_dir)
    if not candidates and (run_dir.parent / BATCH_FILE).exists():
        candidates = log_dirs(run_dir.parent)
    if not candidates:
        return None
    finished = [run_dir / name for name in (SUMMARY_FILE, METRICS_FILE) if (run_dir / name).exists()]
    if finished:
        end = finished[0].stat().st_mtime
        started_before = [path for path in candidates if path.stat().st_mtime <= end]
        candidates = started_before or candidates
    return max(candidates, key=lambda path: path.stat().st_mtime)


def _tail(lines: list[str], limit: int) -> tuple[list[str], int]:
    return (lines[-limit:], len(lines) - limit) if len(lines) > limit else (lines, 0)


def read_log_files(run_dir: Path, limit: int = MAX_LOG_LINES) -> list[LogFile]:
    """Each rank's stdout.log and stderr.log of the last attempt, rank order, stdout first."""
    log_dir = _launch_log_dir(run_dir)
    if log_dir is None:
        return []
    latest: dict[tuple[int, str], Path] = {}
    for rank, path in rank_log_files(log_dir):
        latest[(rank, path.stem)] = path  # in path order: a later attempt wins
    logs = []
    for (rank, stream), path in sorted(latest.items(), key=lambda item: (item[0][0], item[0][1] != "stdout")):
        lines, omitted = _tail(path.read_text(errors="replace").splitlines(), limit)
        logs.append(LogFile(rank, stream, lines, omitted, path))
    return logs


def logs_from_memory(logs: dict[int, list[str]], limit: int = MAX_LOG_LINES) -> list[LogFile]:
    """A result's in-memory logs (``RunResult.logs``: rank -> lines, -1 = torchrun's own output)."""
    result = []
    for rank in sorted(logs, key=lambda r: (r < 0, r)):
        lines, omitted = _tail(list(logs[rank]), limit)
        result.append(LogFile(rank, "output", lines, omitted))
    return result


def read_run(run_dir: str | Path, logs: dict[int, list[str]] | None = None) -> RunData:
    """The files of ``run_dir``; ``logs`` (rank -> lines) replaces the log files when given.

    Raises ``ValueError`` when ``run_dir`` is missing, is not a run directory or holds broken JSON.
    """
    if not isinstance(run_dir, (str, os.PathLike)) or not str(run_dir):
        raise ValueError(f"run_dir must be a run directory's path, got {run_dir!r}")
    run_dir = Path(run_dir).expanduser().resolve()
    _check_run_dir(run_dir)
    ranks = sorted(
        int(m[1])
        for p in run_dir.glob(TRACE_FILE.format(rank="*"))
        if (m := re.fullmatch(r"trace_rank(\d+)\.json", p.name))
    )
    return RunData(
        run_dir=run_dir,
        summary=_read_json(run_dir / SUMMARY_FILE),
        metrics=_read_json(run_dir / METRICS_FILE),
        trace_ranks=ranks,
        logs=logs_from_memory(logs) if logs else read_log_files(run_dir),
        chrome_traces=sorted(p.name for p in run_dir.glob("*chrome*.json")),
        incomplete=is_incomplete(run_dir),
    )
