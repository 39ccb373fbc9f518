"""The ranks' clocks put on rank 0's: each rank's epoch is read after a barrier, which a loaded machine can
delay by tens of milliseconds on some ranks, so the timeline aligns them on the collectives themselves."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

Traces = dict[int, list[dict[str, Any]]]


def clock_offsets(traces: Traces) -> dict[int, float]:
    """Per-rank clock offset (seconds, rank 0 = 0) estimated from the collectives themselves.

    The k-th collective on one group (same name and ranks) is the same operation on every member, and
    a collective ends at nearly the same moment on all of them (nobody leaves before the last one
    arrived). Offsets are the least-squares fit of the median end-time difference of every rank pair.
    Needed because each rank's epoch is read after a barrier, which a loaded machine can delay by tens
    of milliseconds on some ranks.
    """
    ranks = sorted(traces)
    ends: dict[tuple, dict[int, float]] = {}
    for rank in ranks:
        seen: dict[tuple, int] = {}
        for event in traces[rank]:
            if event.get("kind") != "collective" or event.get("asynchronous"):
                continue  # an asynchronous collective's end is its wait, which each rank reaches at its own time
            key = (event["group"], tuple(event["ranks"]))
            k = seen[key] = seen.get(key, -1) + 1
            ends.setdefault(key + (k,), {})[rank] = event["t_end"]
    pairs: dict[tuple[int, int], list[float]] = {}
    for members in ends.values():
        first = min(members)
        for rank, end in members.items():
            if rank != first:
                pairs.setdefault((rank, first), []).append(end - members[first])
    if not pairs:
        return {rank: 0.0 for rank in ranks}
    index = {rank: i for i, rank in enumerate(ranks)}
    rows, rhs = [], []
    for (r, s), diffs in pairs.items():
        row = np.zeros(len(ranks))
        row[index[r]], row[index[s]] = 1.0, -1.0
        rows.append(row * math.sqrt(len(diffs)))
        rhs.append(float(np.median(diffs)) * math.sqrt(len(diffs)))
    anchor = np.zeros(len(ranks))
    anchor[0] = 1e3
    solution = np.linalg.lstsq(np.array(rows + [anchor]), np.array(rhs + [0.0]), rcond=None)[0]
    return {rank: float(solution[index[rank]]) for rank in ranks}


def shift_clocks(traces: Traces, offsets: dict[int, float]) -> Traces:
    """The traces with rank r's times moved by ``-offsets[r]``."""
    shifted = {}
    for rank, events in traces.items():
        d = offsets.get(rank, 0.0)
        shifted[rank] = [
            dict(
                e,
                t_start=e["t_start"] - d,
                t_end=e["t_end"] - d,
                **({"t_wait": e["t_wait"] - d} if "t_wait" in e else {}),
            )
            if "t_start" in e
            else dict(e, t=e["t"] - d)
            if "t" in e
            else e
            for e in events
        ]
    return shifted
