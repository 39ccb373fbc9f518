"""A warm pool left open: 20 recipe runs and 20 ``%%torchrun`` cells in one process hold nothing more
than run 2 did, and the idle workers use no CPU (``launch.processes.pool_worker.release_run``).

Before the fix each warm M4 run left ~27 threads, ~37 fds and 9 listening gloo sockets per rank (541
threads after run 20; the 28th run failed at ``ulimit -n 1024``), and the idle workers used 18-27 % of
a core each. The counts come from the kernel (psutil), independently of the pool's own bookkeeping;
a cell that counts its own listening sockets while its group is alive shows the probe sees gloo's.
"""

from __future__ import annotations

import pytest

import launch
from launch.notebook import magic
from launch.processes.pool import current, shutdown_pool
from launch.processes.pool_health import idle_cpu_percent, worker_resources

pytestmark = pytest.mark.distributed

RUNS = CELLS = 20
SLACK = 2
IDLE_CPU_PERCENT = 1.0
CELL = "x = torch.ones(1) * rank\ndist.all_reduce(x)\nx.item()"
OWN_LISTENERS = "import psutil\nsum(c.status == psutil.CONN_LISTEN for c in psutil.Process().net_connections('tcp'))"


def _within(after, baseline) -> list[str]:
    problems = []
    for now, then in zip(after, baseline):
        for field in ("threads", "fds", "listening"):
            if getattr(now, field) > getattr(then, field) + SLACK:
                problems.append(f"rank {now.rank} {field}: {getattr(then, field)} after run 2 -> {getattr(now, field)}")
    return problems


def test_twenty_runs_and_cells_hold_what_run_two_held_and_idle_uses_no_cpu(tmp_path):
    shutdown_pool()
    pool = current()
    try:
        counts = {}
        for index in range(1, RUNS + 1):
            result = launch.run("M4", world_size=2, dp_shard=2, steps=1, out=tmp_path / "m4")
            assert result.ok, result.error
            if index in (2, RUNS):
                counts[index] = worker_resources(pool)
        assert len(counts[2]) == 2 and not _within(counts[RUNS], counts[2]), _within(counts[RUNS], counts[2])
        sums = []
        for index in range(1, CELLS + 1):
            sums.append(magic.run_cell(CELL, 2))
            if index == 2:
                after_two_cells = worker_resources(pool)
        assert sums == [[1.0, 1.0]] * CELLS  # 0 + 1 on both ranks, every time
        after_cells = worker_resources(pool)
        assert not _within(after_cells, after_two_cells), _within(after_cells, after_two_cells)
        assert not _within(after_cells, counts[2])
        # the probe sees a live gloo group: inside a cell each rank listens on sockets it did not hold idle
        listening_in_cell = magic.run_cell(OWN_LISTENERS, 2)
        assert all(n > w.listening for n, w in zip(listening_in_cell, after_cells)), (listening_in_cell, after_cells)
        idle = idle_cpu_percent(pool, 10.0)
        assert len(idle) == 2 and max(idle.values()) <= IDLE_CPU_PERCENT, idle
        print(f"per worker after run 2 {counts[2]}, after run {RUNS} {counts[RUNS]}, after cells {after_cells}")
        print(f"idle CPU over 10 s: {idle}")
    finally:
        shutdown_pool()
