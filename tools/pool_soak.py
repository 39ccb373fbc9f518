"""A day of mixed use on one warm pool: N recipe launches of every family and a %%torchrun cell every fourth
launch, with each worker's threads, open fds and listening sockets (counted by the kernel, psutil) at chosen
launches and the idle CPU at the end. tests/test_pool_soak.py runs a short version in `make test`.

    .venv/bin/python tools/pool_soak.py                 200 launches, 50 cells (about 3 minutes on 2 cores)
    .venv/bin/python tools/pool_soak.py --launches 40

Exit 1 when a worker ends above its first cell's threads or fds (+2), holds a listening socket, grew its
resident memory by more than 16 MiB after the first quarter of the launches, or idles above 1 % of a core.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import launch
from launch.notebook import magic
from launch.processes.pool import current, shutdown_pool
from launch.processes.pool_health import idle_cpu_percent, worker_resources

MIX = ("S2", "M4", "M2", "S1", "P1", "M7", "M5", "M3")
"""Each on its default mesh: the 4-D S2 first, so the pool starts at its full size of 4 workers."""
CELL = "x = torch.ones(1) * rank\ndist.all_reduce(x)\nx.item()"
SLACK, IDLE_LIMIT = 2, 1.0
RESIDENT_GROWTH_MIB = 16
"""Resident memory may still grow after the first quarter of the launches (the allocator's arenas, the
sharding memo's answers for a shape seen late) but by no more than this per worker: a leak of one run's
tensors or modules would add more every launch."""


def counts(pool) -> list[tuple[int, int, int, int]]:
    """(rank, threads, fds, listening sockets) per worker."""
    return [(w.rank, w.threads, w.fds, w.listening) for w in worker_resources(pool)]


def resident_mib(pool) -> list[int]:
    """Each worker's resident memory, MiB, by rank."""
    return [round(w.rss_mib) for w in worker_resources(pool)]


def soak(launches: int, marks: set[int]) -> int:
    shutdown_pool()
    pool = current()
    try:
        magic.run_cell("1", 4)
        first = counts(pool)
        print(f"after a first cell (rank, threads, fds, listening): {first}", flush=True)
        out, cells, worst, started = tempfile.mkdtemp(prefix="hp-soak-"), 0, first, time.monotonic()
        settled = None  # resident MiB per worker once a quarter of the launches ran
        for index in range(1, launches + 1):
            recipe = MIX[(index - 1) % len(MIX)]
            result = launch.run(recipe, steps=1, out=f"{out}/{index}")
            if not result.ok:
                print(f"launch {index} ({recipe}) failed: {result.error}", file=sys.stderr)
                return 1
            if index % 4 == 0:
                ranks = 2 + 2 * (cells % 2)
                if magic.run_cell(CELL, ranks) != [ranks * (ranks - 1) / 2] * ranks:
                    print(f"cell {cells + 1} summed wrongly", file=sys.stderr)
                    return 1
                cells += 1
            now = counts(pool)
            worst = [max(a, b) for a, b in zip(worst, now)]
            if settled is None and index >= launches / 4:
                settled = resident_mib(pool)
            if index in marks or index == launches:
                print(
                    f"launch {index} ({cells} cells, {time.monotonic() - started:.0f} s): {now}, "
                    f"resident MiB {resident_mib(pool)}",
                    flush=True,
                )
        resident = resident_mib(pool)
        idle = idle_cpu_percent(pool, 10.0)
        print(f"idle CPU over 10 s, % of a core per worker: {idle}")
    finally:
        shutdown_pool()
    grown = [
        f"rank {f[0]}: threads {f[1]} -> {w[1]}, fds {f[2]} -> {w[2]}, listening {w[3]}"
        for f, w in zip(first, worst)
        if w[1] > f[1] + SLACK or w[2] > f[2] + SLACK or w[3]
    ]
    grown += [
        f"rank {rank}: resident {then} -> {now} MiB after launch {max(1, round(launches / 4))}"
        for rank, (then, now) in enumerate(zip(settled, resident))
        if now > then + RESIDENT_GROWTH_MIB
    ]
    busy = {rank: value for rank, value in idle.items() if value > IDLE_LIMIT}
    for problem in grown + ([f"idle workers busy: {busy}"] if busy else []):
        print(problem, file=sys.stderr)
    return 1 if grown or busy else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=200, help="recipe launches (a cell after every fourth)")
    args = parser.parse_args(argv)
    if args.launches < 1:
        parser.error("--launches must be at least 1")
    return soak(args.launches, {2, 50, 100, 150, 200})


if __name__ == "__main__":
    sys.exit(main())
