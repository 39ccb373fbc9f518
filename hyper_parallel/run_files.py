"""The files of a run directory and how to read them, without importing torch.

The launcher (parent process), the figures and the report read runs; only workers import torch.

    trace_rank{r}.json   {"format", "rank", "world_size", "events": [...]}  one per rank (docs/design.md §5)
    metrics.json         rank 0: losses, reference losses, differences, step times
    summary.json         written by the launcher: recipe, degrees, ok, losses, errors
    chrome_trace.json    every rank's events for Perfetto / chrome://tracing (``to_chrome_trace``)

Trace files carry ``format`` (``TRACE_FORMAT``): readers refuse a newer one they cannot read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRACE_FILE = "trace_rank{rank}.json"
METRICS_FILE = "metrics.json"
SUMMARY_FILE = "summary.json"
CHROME_TRACE_FILE = "chrome_trace.json"
TRACE_FORMAT = 2
"""1: collectives and placements; 2: + compute spans and asynchronous collectives (t_wait)."""
EXIT_MISMATCH = 3
"""The worker's exit status (rank 0) when a run trained but differs from its single-process reference."""
PROGRESS_PREFIX = "[progress] "
"""Rank 0 prints one such line (followed by a JSON object) per training step."""


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
    path = Path(path)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path


def _span_name(event: dict[str, Any]) -> str:
    """A compute span's unit, a ring step's block, or a pipeline event's action (forward/backward of a
    microbatch on a stage)."""
    if event["kind"] == "compute":
        return f"compute {event['module'] or 'model'}"
    if event["kind"] == "ring":
        return f"ring step {event['ring_step']}: block {event['block']} ({event['pairs']} pairs)"
    return " ".join(f"{key} {event[key]}" for key in ("action", "microbatch", "stage") if key in event) or "pipeline"
