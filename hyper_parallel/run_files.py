"""The files of a run directory and how to read them, without importing torch.

The launcher (parent process), the figures and the report read runs; only workers import torch.

    trace_rank{r}.json   {"format", "rank", "world_size", "events": [...]}  one per rank (docs/design.md §5)
    metrics.json         rank 0: losses, reference losses, differences, step times
    summary.json         written by the launcher: recipe, degrees, ok, losses, errors
    chrome_trace.json    every rank's events for Perfetto / chrome://tracing (``to_chrome_trace``)
    batch.json           written by the launcher into the launch's directory: the runs it started
    report.html          ``python -m launch report``; <figure>.png/.svg: ``hyper_parallel.viz.run_figures``

Trace files carry ``format`` (``TRACE_FORMAT``): readers refuse a newer one they cannot read. Every file
is written whole or not at all (``write_atomic``): a full disk or an interrupt leaves no truncated file
that looks complete, and a symbolic link planted under a file's name is replaced, never written through.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

TRACE_FILE = "trace_rank{rank}.json"
METRICS_FILE = "metrics.json"
SUMMARY_FILE = "summary.json"
CHROME_TRACE_FILE = "chrome_trace.json"
BATCH_FILE = "batch.json"
REPORT_FILE = "report.html"
FIGURE_FILES = ("{name}.png", "{name}.svg")
"""How a run figure is saved (its names: ``hyper_parallel.viz.figure_registry.FIGURES``)."""
TRACE_FORMAT = 2
"""1: collectives and placements; 2: + compute spans and asynchronous collectives (t_wait)."""
EXIT_MISMATCH = 3
"""The worker's exit status (rank 0) when a run trained but differs from its single-process reference."""
PROGRESS_PREFIX = "[progress] "
"""Rank 0 prints one such line (followed by a JSON object) per training step."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class NoSpaceError(OSError):
    """A run's file could not be written because its disk (or the user's quota) is full."""


def no_space(folder: str | Path, error: OSError) -> NoSpaceError:
    return NoSpaceError(
        error.errno, f"no space left in {folder} ({error.strerror}); free some space there, or write the run elsewhere"
    )


def names_no_space(text: str) -> bool:
    """Whether an error's text (a rank's traceback) says a disk was full."""
    return any(mark in text for mark in (NoSpaceError.__name__, *map(os.strerror, NO_SPACE)))


@contextlib.contextmanager
def disk_full_named(folder: str | Path):
    """Raise a full disk met inside as ``NoSpaceError`` naming the folder being written (the file's, if known)."""
    try:
        yield
    except NoSpaceError:
        raise
    except OSError as error:
        if error.errno not in NO_SPACE:
            raise
        raise no_space(Path(error.filename).parent if error.filename else folder, error) from None


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all: into a new file beside it (created exclusively, so no
    link is followed), then renamed over ``path``. On any error the new file is removed and ``path`` is
    left as it was; a full disk raises ``NoSpaceError`` naming the folder."""
    path = Path(path)
    with disk_full_named(path.parent):
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data.encode() if isinstance(data, str) else data)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    return path


def trace_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / TRACE_FILE.format(rank=rank)


def load_traces(run_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's events of a run directory, by rank."""
    traces = {}
    for path in sorted(Path(run_dir).glob(TRACE_FILE.format(rank="*"))):
        payload = json.loads(path.read_text())
        if payload.get("format", 1) > TRACE_FORMAT:
            raise ValueError(
                f"{path} has trace format {payload['format']}, newer than this version reads "
                f"({TRACE_FORMAT}): update hyper-parallel-workbook"
            )
        traces[int(payload["rank"])] = payload["events"]
    return traces


def load_json(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def to_chrome_trace(traces: dict[int, list[dict[str, Any]]], path: str | Path) -> Path:
    """Write a Chrome trace (opens in Perfetto / chrome://tracing): one process per rank, one track per group,
    one for compute, one for the pipeline's actions, one for the ring's steps and one for placement changes."""
    events = []
    for rank, rank_events in sorted(traces.items()):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for event in rank_events:
            if event["kind"] == "collective":
                events.append(
                    {
                        "ph": "X",
                        "pid": rank,
                        "tid": event["group"],
                        "cat": event["phase"],
                        "name": f"{event['op']}[{event['group']}]",
                        "ts": event["t_start"] * 1e6,
                        "dur": max(event["t_end"] - event["t_start"], 1e-7) * 1e6,
                        "args": {k: event[k] for k in ("bytes", "dtype", "ranks", "module", "step", "phase")},
                    }
                )
            elif event["kind"] in ("compute", "pipeline", "ring"):
                events.append(
                    {
                        "ph": "X",
                        "pid": rank,
                        "tid": event["kind"],
                        "cat": event.get("phase", ""),
                        "name": _span_name(event),
                        "ts": event["t_start"] * 1e6,
                        "dur": max(event["t_end"] - event["t_start"], 1e-7) * 1e6,
                        "args": {k: v for k, v in event.items() if k not in ("kind", "t_start", "t_end")},
                    }
                )
            else:
                events.append(
                    {
                        "ph": "i",
                        "s": "t",
                        "pid": rank,
                        "tid": "placements",
                        "cat": event["phase"],
                        "name": f"{event['param']}: {event['before']} -> {event['after']}",
                        "ts": event["t"] * 1e6,
                        "args": {"local_shape": event["local_shape"], "global_shape": event["global_shape"]},
                    }
                )
    return write_atomic(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


def _span_name(event: dict[str, Any]) -> str:
    """A compute span's unit, a ring step's block, or a pipeline event's action (forward/backward of a
    microbatch on a stage)."""
    if event["kind"] == "compute":
        return f"compute {event['module'] or 'model'}"
    if event["kind"] == "ring":
        return f"ring step {event['ring_step']}: block {event['block']} ({event['pairs']} pairs)"
    return " ".join(f"{key} {event[key]}" for key in ("action", "microbatch", "stage") if key in event) or "pipeline"
