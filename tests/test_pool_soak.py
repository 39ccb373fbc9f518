"""A warm pool left open through a mixed day holds nothing between runs, and its idle workers use no CPU
(``launch.processes.pool_worker.release_run``).

Recipes of every family run one after another on one pool (TP, EP, PP, CP, HSDP and the 4-D
dp x tp x ep x etp of S2), with ``%%torchrun`` cells of 2 and 4 ranks between them. After each, every
worker must be back where a trivial first cell left it: no listening socket (a live gloo group always
holds some, which a cell counting its own shows), threads and fds within ``SLACK``, no DeviceMesh
left in memory. The counts come from the kernel (psutil), independently of the pool's bookkeeping.
"""

from __future__ import annotations

import pytest

import launch
from launch.notebook import magic
from launch.processes.pool import current, shutdown_pool
from launch.processes.pool_health import idle_cpu_percent, worker_resources

pytestmark = pytest.mark.distributed

MIXED_DAY = ("S2", "M2", "P1", "M5", "S1", "M7")
"""Each on its default mesh: S2 dp2 x tp2 x ep2 x etp2 (4 ranks, first so the pool starts at its full
size), M2 tp2, P1 pp2 x dp2, M5 cp2, S1 dp4 x ep2, M7 dp_replicate2 x dp_shard2."""
SLACK = 2
IDLE_CPU_PERCENT = 1.0
CELL = "x = torch.ones(1) * rank\ndist.all_reduce(x)\nx.item()"
OWN_LISTENERS = "import psutil\nsum(c.status == psutil.CONN_LISTEN for c in psutil.Process().net_connections('tcp'))"
MESHES_ALIVE = (
    "import gc\nfrom torch.distributed.device_mesh import DeviceMesh\n"
    "gc.unfreeze()\ngc.collect()\nsum(isinstance(o, DeviceMesh) for o in gc.get_objects())"
)
"""The meshes alive on a rank; ``gc.unfreeze`` first, so one the worker froze after a run
(``pool_worker.freeze_survivors``) is listed too."""


def _problems(after, baseline, when: str) -> list[str]:
    problems = []
    for now, then in zip(after, baseline):
        if now.listening:
            problems.append(f"{when}: rank {now.rank} still listens on {now.listening} sockets (a group kept)")
        for field in ("threads", "fds"):
            if getattr(now, field) > getattr(then, field) + SLACK:
                problems.append(f"{when}: rank {now.rank} {field} {getattr(then, field)} -> {getattr(now, field)}")
    return problems


def test_a_mixed_day_of_recipes_and_cells_keeps_no_group_and_idle_uses_no_cpu(tmp_path):
    shutdown_pool()
    pool = current()
    try:
        assert magic.run_cell("1", 4) == [1, 1, 1, 1]
        baseline = worker_resources(pool)
        assert len(baseline) == 4 and not any(w.listening for w in baseline), baseline
        problems, sums = [], []
        for index, recipe in enumerate(MIXED_DAY):
            result = launch.run(recipe, steps=1, out=tmp_path / recipe)
            assert result.ok, result.error
            problems += _problems(worker_resources(pool), baseline, f"after {recipe}")
            ranks = 2 + 2 * (index % 2)
            sums.append((ranks, magic.run_cell(CELL, ranks)))
            problems += _problems(worker_resources(pool), baseline, f"after a {ranks}-rank cell")
        assert not problems, "\n".join(problems)
        assert all(values == [ranks * (ranks - 1) / 2] * ranks for ranks, values in sums), sums  # 0+1(+2+3)
        assert magic.run_cell(MESHES_ALIVE, 4) == [0, 0, 0, 0]
        # the probe sees a live gloo group: inside a cell each rank listens on sockets it does not hold idle
        assert all(n > 0 for n in magic.run_cell(OWN_LISTENERS, 4))
        idle = idle_cpu_percent(pool, 10.0)
        assert len(idle) == 4 and max(idle.values()) <= IDLE_CPU_PERCENT, idle
        print(f"per worker after a first cell {baseline}, after the mixed day {worker_resources(pool)}")
        print(f"idle CPU over 10 s: {idle}")
    finally:
        shutdown_pool()
