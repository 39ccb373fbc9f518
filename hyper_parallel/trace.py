"""Per-rank recorder of collectives, compute spans and placement transitions.

``with trace.record() as rec:`` makes ``rec`` the current recorder of this thread of control (a
``ContextVar``, so nested or concurrent runs do not mix); code that communicates calls
``trace.collective(...)`` / ``trace.placement(...)``, which cost one ContextVar lookup when nothing
records. Times are seconds of the host's wall clock since rank 0's epoch (broadcast once), so the
ranks of one machine share a clock exactly (across machines: as well as their clocks are synced).
Reading and exporting saved traces is in ``hyper_parallel.run_files`` (no torch needed).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from hyper_parallel import link
from hyper_parallel.run_files import TRACE_FORMAT, write_atomic

PHASES = ("init", "forward", "backward", "optimizer", "other")

_current: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("hyper_parallel_recorder", default=None)


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
        self.compute_start: float | None = None  # the open compute span (see outside_compute)
        self.compute_labels: tuple[str, str, int] = ("other", "", 0)
        epoch = [time.time()]
        if dist.is_initialized():
            dist.broadcast_object_list(epoch, src=0)
        self.epoch = epoch[0]

    def now(self) -> float:
        return time.time() - self.epoch

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"format": TRACE_FORMAT, "rank": self.rank, "world_size": self.world_size, "events": self.events}
        return write_atomic(path, json.dumps(payload))


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


def set_module(module: str) -> str:
    """Label what follows with ``module``; returns the previous label (to restore it)."""
    recorder = _current.get()
    if recorder is None:
        return ""
    previous, recorder.module = recorder.module, module
    return previous


def set_step(step: int) -> None:
    """Label what follows with training step ``step``."""
    recorder = _current.get()
    if recorder is not None:
        recorder.step = int(step)


@contextlib.contextmanager
def span(kind: str, **fields: Any) -> Iterator[dict[str, Any]]:
    """One timed event of ``kind`` around the block, e.g. a pipeline stage's forward of a microbatch.

    Recorded when the block ends without an exception; ``fields`` are written as given, then those the
    block put in the dict it is given (what is known only at its end), the step and the block's start
    and end."""
    recorder = _current.get()
    start = time.time()
    late: dict[str, Any] = {}
    yield late
    if recorder is not None:
        recorder.events.append(
            {
                "kind": kind,
                **fields,
                **late,
                "step": recorder.step,
                "t_start": start - recorder.epoch,
                "t_end": time.time() - recorder.epoch,
            }
        )


def p2p(
    op: str, peers: list[int], nbytes: int, dtype: torch.dtype, *, group: str, phase: str, module: str, **extra
) -> None:
    """A point-to-point send or receive (``op``) to ``peers`` (global ranks), recorded when it is posted.

    It is a collective event of zero duration on ``group``: the code that posted it waits later, and
    the wait shows as the gap before its next event. ``extra`` fields (e.g. the microbatch) are added."""
    recorder = _current.get()
    if recorder is None:
        return
    now = recorder.now()
    ranks = sorted({recorder.rank, *peers})
    _append_collective(
        recorder, op, group, ranks, nbytes, dtype, (phase, module, recorder.step), now, now, peer=min(peers), **extra
    )


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
def collective(
    op: str, group: str, ranks: list[int], nbytes: int, dtype: torch.dtype, module: str | None = None, **fields
) -> Iterator[None]:
    """Time one synchronous collective issued inside the block; ``nbytes`` is the full (unsharded) buffer
    size, ``fields`` are added to the event. Compute is paused meanwhile: the training thread waits for the wire."""
    recorder = _current.get()
    if recorder is None:
        yield
        return
    with outside_compute():
        labels_now = recorder.phase, module if module is not None else recorder.module, recorder.step
        start = recorder.now()
        yield
        if recorder.sync_cuda:
            torch.cuda.synchronize()
        _append_collective(recorder, op, group, ranks, nbytes, dtype, labels_now, start, recorder.now(), **fields)


def issued(
    op: str, group: str, ranks: list[int], nbytes: int, dtype: torch.dtype, module: str | None = None, **fields
) -> Callable[[float, bool], None] | None:
    """For a collective (or a send / receive) issued asynchronously now: take its labels and issue time;
    the returned function, called once it has been waited for with (wait-call time, completed before the
    wait?), records it.

    ``t_start`` is the issue, ``t_end`` the moment ``wait()`` returned (gloo's work objects tell no
    completion time of their own), ``t_wait`` when the wait was called: a collective that had
    completed by then (``done_before_wait``) was hidden behind compute entirely. ``fields`` (a send's
    ``peer``, a pipelined collective's ``chunk``) are added to the event.
    """
    recorder = _current.get()
    if recorder is None:
        return None
    labels_now = recorder.phase, module if module is not None else recorder.module, recorder.step
    start = recorder.now()

    def completed(t_wait: float, done_before_wait: bool) -> None:
        _append_collective(
            recorder,
            op,
            group,
            ranks,
            nbytes,
            dtype,
            labels_now,
            start,
            recorder.now(),
            asynchronous=True,
            t_wait=t_wait,
            done_before_wait=done_before_wait,
            **fields,
        )

    return completed


def _append_collective(
    recorder: Recorder,
    op: str,
    group: str,
    ranks,
    nbytes: int,
    dtype: torch.dtype,
    labels_now: tuple[str, str, int],
    start: float,
    end: float,
    **extra,
) -> None:
    phase, module, step = labels_now
    recorder.events.append(
        {
            "kind": "collective",
            "op": op,
            "group": group,
            "ranks": list(ranks),
            "bytes": int(nbytes),
            "dtype": str(dtype).removeprefix("torch."),
            "phase": phase,
            "module": module,
            "step": step,
            "t_start": start,
            "t_end": end,
            **extra,
        }
    )


@contextlib.contextmanager
def outside_compute(start_after: bool | None = None) -> Iterator[None]:
    """The block is not model compute (a fully_shard hook, a collective): end the open compute span
    before it; after it open a new one labelled with the module then current, if one was open
    (``start_after`` None), always (True: the root's forward begins), or never (False: backward ended).

    Compute spans are what the timeline draws under the collectives, and what exposed communication
    (a collective in flight while no compute runs) is measured against.
    """
    recorder = _current.get()
    if recorder is None:
        yield
        return
    was_open = recorder.compute_start is not None
    if was_open:
        recorder.events.append(
            {
                "kind": "compute",
                "module": recorder.compute_labels[1],
                "phase": recorder.compute_labels[0],
                "step": recorder.compute_labels[2],
                "t_start": recorder.compute_start,
                "t_end": recorder.now(),
            }
        )
        recorder.compute_start = None
    try:
        yield
    finally:
        if start_after or (start_after is None and was_open):
            recorder.compute_start = recorder.now()
            recorder.compute_labels = (recorder.phase, recorder.module, recorder.step)


def placement(
    param: str,
    mesh_dims: tuple[str, ...],
    before: str,
    after: str,
    local_shape: tuple[int, ...],
    global_shape: tuple[int, ...],
) -> None:
    """Record that ``param`` moved from placements ``before`` to ``after``."""
    recorder = _current.get()
    if recorder is None:
        return
    recorder.events.append(
        {
            "kind": "placement",
            "param": param,
            "mesh_dims": list(mesh_dims),
            "before": before,
            "after": after,
            "local_shape": list(local_shape),
            "global_shape": list(global_shape),
            "phase": recorder.phase,
            "step": recorder.step,
            "t": recorder.now(),
        }
    )


_FUNCTIONAL_OPS = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_reduce": "all_reduce",
    "all_to_all_single": "all_to_all",
}


class TorchCollectiveTracer(TorchDispatchMode):
    """Record the collectives torch issues by itself (DTensor redistributions of TP/SP layers).

    Our own collectives go through ``hyper_parallel.comm``; DTensor's go through the functional
    collectives ``_c10d_functional.*``, which this dispatch mode intercepts (a tensor subclass's, such as
    torchao's float8 tensors, once it has unwrapped them: with their real dtype and bytes). ``group_names`` maps a
    group's sorted global ranks to the mesh dim it belongs to (``MeshViews.group_names()``). Each op is
    waited for at once so its bar on the timeline has a real end (on CPU/gloo it is synchronous anyway).
    """

    def __init__(self, group_names: dict[tuple[int, ...], str]) -> None:
        super().__init__()
        self.group_names = group_names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not all(issubclass(t, DTensor) or t.__torch_dispatch__ is torch.Tensor.__torch_dispatch__ for t in types):
            return NotImplemented  # a tensor subclass (torchao's float8) unwraps first; its inner collective comes back
        op = _FUNCTIONAL_OPS.get(func._overloadpacket.__name__) if func.namespace == "_c10d_functional" else None
        if op is None or _current.get() is None:
            return func(*args, **kwargs)
        tensor, group_name = args[0], str(args[-1])
        group = dist.distributed_c10d._resolve_process_group(group_name)
        ranks = dist.get_process_group_ranks(group)
        nbytes = tensor.numel() * tensor.element_size() * (len(ranks) if op == "all_gather" else 1)
        name = self.group_names.get(tuple(sorted(ranks)), group_name)
        with collective(op, name, ranks, nbytes, tensor.dtype):
            end = link.reserve(op, name, len(ranks), nbytes)  # an emulated link delays these too
            out = func(*args, **kwargs)
            out = torch.ops._c10d_functional.wait_tensor(out)
            link.hold_until(end)
        return out
