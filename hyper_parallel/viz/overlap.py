"""Exposed communication: the time a collective is in flight while no compute runs, per rank and step.

fully_shard's hooks record compute spans (``kind: "compute"``) between the moments the training thread
spends in its own hooks and collectives; every collective records when it was issued and when its
wait returned. Per rank and step:

    in flight  = |union of collective intervals|
    exposed    = |in flight minus the union of compute spans|   (the wire holds the step up)
    hidden     = in flight - exposed                             (communication behind compute)

A synchronous collective is always exposed; an asynchronous one (prefetch, reduce-scatter left in
flight) is hidden for as long as compute runs before its wait. Torch-free: reads saved traces.
"""

from __future__ import annotations

from typing import Any

Interval = tuple[float, float]


def union(intervals: list[Interval]) -> list[Interval]:
    """Sorted, non-overlapping intervals covering the same time."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def minus(intervals: list[Interval], removed: list[Interval]) -> list[Interval]:
    """The parts of ``intervals`` outside ``removed``."""
    result, cuts = [], union(removed)
    for start, end in union(intervals):
        cursor = start
        for cut_start, cut_end in cuts:
            if cut_end <= cursor or cut_start >= end:
                continue
            if cut_start > cursor:
                result.append((cursor, cut_start))
            cursor = max(cursor, cut_end)
        if cursor < end:
            result.append((cursor, end))
    return result


def step_exposure(events: list[dict[str, Any]], step: int, group: str | None = None) -> dict[str, float]:
    """Seconds of communication in flight, exposed and hidden, and of compute, in ``step`` of one rank
    (``group``: only the collectives on that group, e.g. a ring's sends and receives on cp)."""
    comm = [
        (e["t_start"], e["t_end"])
        for e in events
        if e.get("kind") == "collective"
        and e["step"] == step
        and e["phase"] != "init"
        and (group is None or e["group"] == group)
    ]
    compute = [(e["t_start"], e["t_end"]) for e in events if e.get("kind") == "compute" and e["step"] == step]
    in_flight, exposed = length(comm), length(minus(comm, compute))
    return {"in_flight": in_flight, "exposed": exposed, "hidden": in_flight - exposed, "compute": length(compute)}


def exposure(
    traces: dict[int, list[dict[str, Any]]], step: int, group: str | None = None
) -> dict[int, dict[str, float]]:
    """``step_exposure`` of every rank."""
    return {rank: step_exposure(events, step, group) for rank, events in sorted(traces.items())}


def has_compute(traces: dict[int, list[dict[str, Any]]]) -> bool:
    return any(e.get("kind") == "compute" for events in traces.values() for e in events)


def chunk_overlap(events: list[dict[str, Any]], step: int) -> dict[str, float] | None:
    """Async TP's pipelined collectives (events with a ``chunk``) in ``step`` of one rank: seconds in flight,
    seconds of that with compute running (hidden), and ``fraction`` = hidden / in flight. None without any.

    A chunk hidden behind another chunk's matmul counts as hidden: that is the pipeline at work."""
    chunked = [e for e in events if e.get("kind") == "collective" and e["step"] == step and e.get("chunk") is not None]
    if not chunked:
        return None
    numbers = step_exposure([*chunked, *(e for e in events if e.get("kind") == "compute")], step)
    in_flight = numbers["in_flight"]
    return {
        "in_flight": in_flight,
        "hidden": numbers["hidden"],
        "fraction": numbers["hidden"] / in_flight if in_flight > 0 else 0.0,
        "collectives": len(chunked),
    }


def compute_by_phase(events: list[dict[str, Any]], step: int) -> dict[str, float]:
    """Seconds of compute in ``step`` of one rank per phase ("forward", "backward", ...): the measured input
    of the emulated link's model (``cost_model.emulated``)."""
    result: dict[str, float] = {}
    for e in events:
        if e.get("kind") == "compute" and e["step"] == step:
            result[e["phase"]] = result.get(e["phase"], 0.0) + e["t_end"] - e["t_start"]
    return result


def step_waiting(events: list[dict[str, Any]], step: int) -> float:
    """Seconds the training thread of one rank waited for communication in ``step``: the union of every
    synchronous collective and of every asynchronous one's wait (``t_wait`` to its end). Below ``exposed``
    when fully_shard's hooks run while a collective is in flight: that time the hooks would take anyway,
    so it is what the emulated link's model calls exposed (``cost_model.emulated``)."""
    waits = [
        (e.get("t_wait", e["t_start"]), e["t_end"])
        for e in events
        if e.get("kind") == "collective" and e["step"] == step and e["phase"] != "init"
    ]
    return length(waits)
