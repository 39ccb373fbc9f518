"""``python -m launch bench-latency``: how long an experiment waits for its workers, side by side.

For each case it measures, ``repeats`` times, alternating so that a slow moment of a loaded machine hits
every column: a fresh torchrun launch (``pool=False``), the first run on a new warm pool (the pool ended
just before), and a warm run (the pool already up). It prints the medians. The training itself is
milliseconds: the rest is starting torchrun, N interpreters importing torch and a rendezvous, which the
warm pool pays once per Python process.

It then counts what each warm worker holds after run 2 and after run N of M4 (threads, open fds,
listening sockets) and its CPU over 10 s of idling: a pool left open all day must not grow or spin.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from launch import inputs
from launch.processes.pool import current, shutdown_pool
from launch.processes.pool_health import WorkerResources, idle_cpu_percent, worker_resources
from launch.runs import run
from launch.tables import print_table

CASES = {
    "M4": {"world_size": 2, "dp_shard": 2},
    "M7": {"world_size": 4, "dp_replicate": 2, "dp_shard": 2},
    "S2": {"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2, "etp": 2},
}
CELL = "x = torch.ones(1) * rank\ndist.all_reduce(x)\nx.item()"


def _seconds(action: Callable[[], object]) -> float:
    start = time.monotonic()
    action()
    return time.monotonic() - start


def _recipe(name: str, degrees: dict, pool: bool) -> Callable[[], None]:
    def action() -> None:
        result = run(name, steps=1, pool=pool, **degrees)
        if not result.ok:
            raise RuntimeError(f"{name} failed during the latency benchmark:\n{result.error}")

    return action


def _cell(nproc: int) -> Callable[[], None]:
    def action() -> None:
        current().run(nproc, {"kind": "code", "code": CELL}, 120)

    return action


def measure(repeats: int = 5) -> list[tuple[str, float | None, float, float]]:
    """(case, fresh launch s, first pool run s, warm pool run s): medians over ``repeats``."""
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    rows = []
    cases = [
        (
            f"launch.run {name} ({degrees['world_size']} ranks)",
            _recipe(name, degrees, True),
            _recipe(name, degrees, False),
        )
        for name, degrees in CASES.items()
    ]
    cases.append(("%%torchrun -n 4, one all-reduce", _cell(4), None))
    for label, on_pool, fresh in cases:
        fresh_times, first_times, warm_times = [], [], []
        for _ in range(repeats):
            if fresh is not None:
                fresh_times.append(_seconds(fresh))
            shutdown_pool()
            first_times.append(_seconds(on_pool))
            warm_times.append(_seconds(on_pool))
        rows.append(
            (
                label,
                statistics.median(fresh_times) if fresh_times else None,
                statistics.median(first_times),
                statistics.median(warm_times),
            )
        )
    shutdown_pool()
    return rows


def print_latency(rows: list[tuple[str, float | None, float, float]], repeats: int) -> None:
    print(
        f"wall time of an experiment, median of {repeats} (alternated): a fresh torchrun launch, the first run "
        "on a new warm pool, a warm run"
    )
    print_table(
        ("case", "fresh launch s", "first on pool s", "warm s", "warm / fresh"),
        [
            (
                label,
                f"{fresh:.2f}" if fresh is not None else "-",
                f"{first:.2f}",
                f"{warm:.2f}",
                f"{warm / fresh:.3f}" if fresh else "-",
            )
            for label, fresh, first, warm in rows
        ],
    )


def measure_resources(runs: int = 20, idle_seconds: float = 10.0) -> dict:
    """Per-worker threads/fds/listening sockets after warm M4 run 2 and run ``runs``, and idle CPU %."""
    runs = inputs.positive_int(runs, "--runs")
    shutdown_pool()
    counts: dict[int, list[WorkerResources]] = {}
    for index in range(1, max(runs, 2) + 1):
        _recipe("M4", CASES["M4"], True)()
        if index in (2, runs):
            counts[index] = worker_resources(current())
    idle = idle_cpu_percent(current(), idle_seconds)
    shutdown_pool()
    return {"counts": counts, "idle_cpu": idle, "idle_seconds": idle_seconds}


def print_resources(measured: dict) -> None:
    print("\nwhat each warm worker holds (M4, 2 ranks; max over ranks) and its CPU while idle")
    rows = []
    for index, workers in sorted(measured["counts"].items()):
        rows.append(
            (
                f"after run {index}",
                str(max(w.threads for w in workers)),
                str(max(w.fds for w in workers)),
                str(max(w.listening for w in workers)),
            )
        )
    print_table(("", "threads", "open fds", "listening sockets"), rows)
    idle = measured["idle_cpu"]
    print(f"idle CPU over {measured['idle_seconds']:g} s: max {max(idle.values(), default=0.0):.1f} % of a core")
