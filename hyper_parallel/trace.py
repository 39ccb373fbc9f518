"""Per-rank recorder of collectives and placement transitions (DESIGN.md §6).

``with trace.record() as rec:`` makes ``rec`` the current recorder of this thread of control (a
``ContextVar``, so nested or concurrent runs do not mix); code that communicates calls
``trace.collective(...)`` / ``trace.placement(...)``, which cost one ContextVar lookup when nothing
records. Times are seconds since an epoch taken right after a barrier, so the ranks' clocks line up.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

PHASES = ("init", "forward", "backward", "optimizer", "other")
TRACE_FILE = "trace_rank{rank}.json"

_current: contextvars.ContextVar["Recorder | None"] = contextvars.ContextVar("hyper_parallel_recorder", default=None)


class Recorder:
    """Collects this rank's events; ``phase``, ``step`` and ``module`` label what is recorded next."""

    def __init__(self, sync_cuda: bool = True) -> None:
        self.events: list[dict[str, Any]] = []
        self.phase = "init"
        self.step = 0
        self.module = ""
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.sync_cuda = sync_cuda and torch.cuda.is_available()
        if dist.is_initialized():
            dist.barrier()
        self.epoch = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.epoch

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"rank": self.rank, "world_size": self.world_size, "events": self.events}
        path.write_text(json.dumps(payload))
        return path


@contextlib.contextmanager
def record(sync_cuda: bool = True) -> Iterator[Recorder]:
    """Record every collective and placement change made inside the block on this rank."""
    recorder = Recorder(sync_cuda=sync_cuda)
    token = _current.set(recorder)
    try:
        yield recorder
    finally:
        _current.reset(token)


def current() -> Recorder | None:
    return _current.get()


def set_phase(phase: str) -> None:
    """Label what follows with ``phase`` (fully_shard's root hooks switch forward/backward)."""
    recorder = _current.get()
    if recorder is not None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; one of {PHASES}")
        recorder.phase = phase


def set_step(step: int) -> None:
    """Label what follows with training step ``step``."""
    recorder = _current.get()
    if recorder is not None:
        recorder.step = int(step)


@contextlib.contextmanager
def labels(*, phase: str | None = None, step: int | None = None, module: str | None = None) -> Iterator[None]:
    """Label the events recorded inside the block (no-op when nothing records)."""
    recorder = _current.get()
    if recorder is None:
        yield
        return
    if phase is not None and phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; one of {PHASES}")
    saved = recorder.phase, recorder.step, recorder.module
    recorder.phase = phase if phase is not None else recorder.phase
    recorder.step = step if step is not None else recorder.step
    recorder.module = module if module is not None else recorder.module
    try:
        yield
    finally:
        recorder.phase, recorder.step, recorder.module = saved


@contextlib.contextmanager
def collective(op: str, group: str, ranks: list[int], nbytes: int, dtype: torch.dtype,
               module: str | None = None) -> Iterator[None]:
    """Time one collective issued inside the block; ``nbytes`` is the full (unsharded) buffer size."""
    recorder = _current.get()
    if recorder is None:
        yield
        return
    start = recorder.now()
    yield
    if recorder.sync_cuda:
        torch.cuda.synchronize()
    recorder.events.append({
        "kind": "collective", "op": op, "group": group, "ranks": list(ranks), "bytes": int(nbytes),
        "dtype": str(dtype).removeprefix("torch."), "phase": recorder.phase,
        "module": module if module is not None else recorder.module, "step": recorder.step,
        "t_start": start, "t_end": recorder.now(),
    })


def placement(param: str, mesh_dims: tuple[str, ...], before: str, after: str,
              local_shape: tuple[int, ...], global_shape: tuple[int, ...]) -> None:
    """Record that ``param`` moved from placements ``before`` to ``after``."""
    recorder = _current.get()
    if recorder is None:
        return
    recorder.events.append({
        "kind": "placement", "param": param, "mesh_dims": list(mesh_dims), "before": before, "after": after,
        "local_shape": list(local_shape), "global_shape": list(global_shape), "phase": recorder.phase,
        "step": recorder.step, "t": recorder.now(),
    })


def load_run(run_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's events of a run directory, by rank."""
    traces = {}
    for path in sorted(Path(run_dir).glob(TRACE_FILE.format(rank="*"))):
        payload = json.loads(path.read_text())
        traces[int(payload["rank"])] = payload["events"]
    return traces


def to_chrome_trace(traces: dict[int, list[dict[str, Any]]], path: str | Path) -> Path:
    """Write a Chrome trace (opens in Perfetto / chrome://tracing): one process per rank, one track per group."""
    events = []
    for rank, rank_events in sorted(traces.items()):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for event in rank_events:
            if event["kind"] == "collective":
                events.append({
                    "ph": "X", "pid": rank, "tid": event["group"], "cat": event["phase"],
                    "name": f"{event['op']}[{event['group']}]",
                    "ts": event["t_start"] * 1e6, "dur": max(event["t_end"] - event["t_start"], 1e-7) * 1e6,
                    "args": {k: event[k] for k in ("bytes", "dtype", "ranks", "module", "step", "phase")},
                })
            else:
                events.append({
                    "ph": "i", "s": "t", "pid": rank, "tid": "placements", "cat": event["phase"],
                    "name": f"{event['param']}: {event['before']} -> {event['after']}", "ts": event["t"] * 1e6,
                    "args": {"local_shape": event["local_shape"], "global_shape": event["global_shape"]},
                })
    path = Path(path)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path
