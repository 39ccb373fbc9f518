"""Time the collectives on the ranks of the current process group, through the traced ones every style uses.

Runs on every rank (a ``%%torchrun`` cell or the warm pool's code task calls it after
``init_process_group``):

    from hyper_parallel.benchmark.collectives import time_collectives
    rows, identity = time_collectives([1024, 65536], repeats=5)

Each collective goes through ``hyper_parallel.comm`` inside ``trace.record()``, so the times are those of
the trace events the figures of every other notebook draw (issue to return on each rank). A row is the
fastest of ``repeats`` calls, each timed on its slowest rank (on a shared machine a slower repeat waited
for a core, not for the wire); one untimed call of each size first warms gloo's buffers. ``send_recv`` is a ring shift (``comm.ring_exchange``): every rank sends ``bytes`` to the next
and receives as much from the previous.

``identity``: ring all-reduce = reduce-scatter + all-gather, on the same random buffer of the smallest and
the largest size: the all-reduce's time and result against those of a reduce-scatter followed by an
all-gather of its output (on gloo our reduce-scatter sums in gloo's all-reduce order,
``hyper_parallel.gloo_sum``: the two results agree bit for bit).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from hyper_parallel import comm, trace
from hyper_parallel.devices import default_device_type

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
ELEMENT = torch.float32


def _world() -> comm.GroupInfo:
    return comm.GroupInfo("world", tuple(range(dist.get_world_size())), dist.group.WORLD)


def _buffers(nbytes: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A full buffer of ``nbytes`` (rounded to whole float32 chunks of n) and one rank's chunk of it."""
    numel = max(n, nbytes // ELEMENT.itemsize // n * n)
    full = torch.rand(numel, generator=torch.Generator().manual_seed(dist.get_rank() + numel)).to(device)
    return full, torch.empty(numel // n, device=device)


def _issue(op: str, full: torch.Tensor, chunk: torch.Tensor, info: comm.GroupInfo) -> None:
    if op == "all_reduce":
        comm.all_reduce(full.clone(), info)
    elif op == "all_gather":
        comm.all_gather_into_tensor(torch.empty_like(full), chunk, info)
    elif op == "reduce_scatter":
        comm.reduce_scatter_tensor(torch.empty_like(chunk), full, info)
    elif op == "all_to_all":
        comm.all_to_all_single(torch.empty_like(full), full, info)
    elif op == "send_recv":
        comm.ring_exchange(full, torch.empty_like(full), info, direction=1).wait()
    else:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def _slowest(seconds: list[float], device: torch.device) -> list[float]:
    """Each repeat's time on the slowest rank."""
    times = torch.tensor(seconds, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist()


def _durations(events: list[dict], op: str) -> list[float]:
    """Issue to return of each traced call of ``op``, in order (a ring shift records a send and a receive:
    from the first issue to the later return)."""
    if op != "send_recv":
        return [e["t_end"] - e["t_start"] for e in events if e["op"] == op]
    sends = [e for e in events if e["op"] == "send"]
    receives = [e for e in events if e["op"] == "recv"]
    return [max(s["t_end"], r["t_end"]) - min(s["t_start"], r["t_start"]) for s, r in zip(sends, receives)]


def _timed(op: str, full: torch.Tensor, chunk: torch.Tensor, info: comm.GroupInfo, repeats: int) -> list[float]:
    """Each repeat's time on this rank; the ranks start every repeat together (barrier, untraced)."""
    with trace.record() as recorder:
        for _ in range(repeats):
            dist.barrier()
            _issue(op, full, chunk, info)
    return _durations(recorder.events, op)


def time_collectives(sizes: Sequence[int], ops: Sequence[str] = OPS, repeats: int = 5) -> tuple[list[dict], list[dict]]:
    """Rows {op, n, bytes, seconds} per op and size (``bytes``: the full buffer, rounded to float32 chunks),
    and the ring identity at the smallest and the largest size {bytes, n, all_reduce, reduce_scatter, all_gather
    (seconds), max_abs_diff}."""
    if repeats < 1 or not sizes:
        raise ValueError(f"need at least one size and repeats >= 1, got {list(sizes)} and {repeats}")
    info, device = _world(), torch.device(default_device_type())
    rows = []
    for nbytes in sizes:
        full, chunk = _buffers(int(nbytes), info.size, device)
        for op in ops:
            _issue(op, full, chunk, info)  # warm-up, untimed
            seconds = _slowest(_timed(op, full, chunk, info, repeats), device)
            rows.append({"op": op, "n": info.size, "bytes": full.numel() * 4, "seconds": min(seconds)})
    ends = sorted({int(min(sizes)), int(max(sizes))})  # the latency end and the bandwidth end
    return rows, [ring_identity(nbytes, repeats) for nbytes in ends]


def ring_identity(nbytes: int, repeats: int = 5) -> dict:
    """An all-reduce of one buffer against a reduce-scatter then an all-gather of it: the fastest time of each
    (slowest rank) and the largest difference between the two results on this rank."""
    info, device = _world(), torch.device(default_device_type())
    full, chunk = _buffers(nbytes, info.size, device)
    with trace.record() as recorder:
        for _ in range(repeats):
            dist.barrier()
            reduced = comm.all_reduce(full.clone(), info)
            comm.reduce_scatter_tensor(chunk, full, info)
            gathered = torch.empty_like(full)
            comm.all_gather_into_tensor(gathered, chunk, info)
    ops = ("all_reduce", "reduce_scatter", "all_gather")
    fastest = {op: min(_slowest(_durations(recorder.events, op), device)) for op in ops}
    difference = float((reduced - gathered).abs().max())
    return {"bytes": full.numel() * 4, "n": info.size, **fastest, "max_abs_diff": difference}
