"""The warm pool (``launch.processes.pool``) and ``%%torchrun`` (``launch.notebook.magic``).

* A warm run equals a fresh torchrun launch bit for bit: the same losses, the same parameter
  differences and the same collectives (op, group, bytes, unit, step) on every rank, for M4 on 2
  ranks, M7 on 4 (the pool grows from 2 to 4 workers in between) and S2 on 4 (TP, SP and EP on 2-D and
  3-D meshes: its second warm run takes every sharding decision from the pool's memo), run twice warm.
* Faults: a rank that raises is reported with its traceback and the pool stays up with its names (same
  worker processes); a rank SIGKILLed or a hang past the timeout end the pool with every process, the
  next run starts a new one and says why the names are gone.
* ``%%torchrun``: each rank's output streamed with its rank, the cell's value per rank, names kept for
  the next cell, an error (or a SyntaxError, caught before sending) shown without raising and without
  losing names, ``--restart`` forgets the names.
"""

from __future__ import annotations

import io
import re
from collections import Counter

import psutil
import pytest

import launch
from launch.notebook import magic
from launch.processes.pool import PoolError, current, shutdown_pool

pytestmark = pytest.mark.distributed


def collectives(result) -> dict[int, Counter]:
    return {
        rank: Counter(
            (e["step"], e["op"], e["group"], e["bytes"], e["module"]) for e in events if e["kind"] == "collective"
        )
        for rank, events in result.traces.items()
    }


def pool_workers() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if any("launch.processes.pool_worker" in part for part in _cmdline(p))
    ]


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


@pytest.fixture
def fresh_pool():
    shutdown_pool()
    yield current()
    shutdown_pool()


@pytest.mark.parametrize(
    "recipe, degrees",
    [
        ("M4", {"world_size": 2, "dp_shard": 2}),
        ("M7", {"world_size": 4, "dp_replicate": 2, "dp_shard": 2}),
        ("S2", {"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2, "etp": 2}),
    ],
)
def test_warm_runs_equal_a_fresh_launch(tmp_path, recipe, degrees):
    fresh = launch.run(recipe, steps=2, out=tmp_path / "fresh", pool=False, **degrees)
    warm = [launch.run(recipe, steps=2, out=tmp_path / f"warm{i}", **degrees) for i in range(2)]
    assert fresh.ok and all(w.ok for w in warm), (fresh.error, [w.error for w in warm])
    for run in warm:
        assert run.metrics["losses"] == fresh.metrics["losses"]
        assert run.metrics["max_param_diff"] == fresh.metrics["max_param_diff"]
        assert collectives(run) == collectives(fresh)
    assert current().size >= degrees["world_size"]


def test_a_rank_that_raises_keeps_the_pool_and_its_names(fresh_pool):
    fresh_pool.run(2, {"kind": "code", "code": "y = 5"}, 60)
    pids = fresh_pool.worker_pids
    with pytest.raises(PoolError, match=r"rank 1 failed:(.|\n)*ValueError: only on rank 1") as failure:
        fresh_pool.run(2, {"kind": "code", "code": "if rank == 1:\n    raise ValueError('only on rank 1')"}, 60)
    assert failure.value.rank == 1 and failure.value.kept and fresh_pool.alive
    # rank 0 waits in an all-reduce that rank 1 never joins: rank 1's group is freed, rank 0 fails too
    code = "if rank == 1:\n    raise KeyError('gone')\nt = torch.ones(1)\ndist.all_reduce(t)"
    with pytest.raises(PoolError, match="rank 1 failed:(.|\n)*KeyError: 'gone'") as failure:
        fresh_pool.run(2, {"kind": "code", "code": code}, 120)
    assert failure.value.kept
    replies = fresh_pool.run(2, {"kind": "code", "code": "y + rank"}, 60)[0]
    assert [magic.decode(r) for r in replies] == [5, 6]  # a name from before both failures
    assert fresh_pool.worker_pids == pids and fresh_pool.restarted_because is None


def test_a_killed_rank_ends_the_pool(fresh_pool):
    code = "import os, signal\nif rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()"
    with pytest.raises(
        PoolError, match=r"rank 1 died during the run \(killed by SIGKILL(.|\n)*names defined by earlier %%torchrun"
    ) as failure:
        fresh_pool.run(2, {"kind": "code", "code": code}, 60)
    assert failure.value.rank == 1 and not failure.value.kept and not pool_workers()
    assert fresh_pool.run(2, {"kind": "code", "code": "world_size"}, 60)[0][0]["ok"]
    # torchrun may notice the kill first and end too: then the pool names its agent as well
    assert re.fullmatch(
        rf"(the pool's agent \(torchrun\) and )?rank 1 died during run {fresh_pool.runs - 1} "
        r"\(killed by SIGKILL \(exit code -9\)\)",
        fresh_pool.restarted_because,
    ), fresh_pool.restarted_because


def test_a_hang_is_ended_at_the_timeout_with_the_stacks(fresh_pool):
    with pytest.raises(PoolError, match=r"timed out after 5 s; ranks still running: \[0, 1\]") as failure:
        fresh_pool.run(2, {"kind": "code", "code": "import time\ntime.sleep(600)"}, 5)
    assert '<%%torchrun cell>", line 2' in str(failure.value)  # each rank's stack at the deadline: the sleep
    assert not pool_workers()
    assert fresh_pool.run(2, {"kind": "code", "code": "1"}, 60)[0][0]["ok"]


def test_torchrun_magic_streams_returns_keeps_names_and_restarts(fresh_pool, capsys):
    stream = io.StringIO()
    cell = "print('hello from', rank)\nx = torch.ones(1) * (rank + 1)\ndist.all_reduce(x)\nx.item()"
    assert magic.run_cell(cell, 2, stream=stream) == [3.0, 3.0]  # 1 + 2 on both ranks
    assert sorted(stream.getvalue().splitlines()) == ["[rank 0] hello from 0", "[rank 1] hello from 1"]
    doubled = magic.run_cell("x * 2", 2)
    assert [t.tolist() for t in doubled] == [[6.0], [6.0]]  # x from the previous cell, a tensor back
    assert magic.torchrun_magic("-n 2", "undefined_name") is None  # shown, not raised
    assert "NameError" in capsys.readouterr().err
    pids = fresh_pool.worker_pids
    assert magic.torchrun_magic("-n 2", "x = (") is None  # never sent: the kernel compiles the cell first
    assert "SyntaxError" in capsys.readouterr().err
    assert [t.tolist() for t in magic.run_cell("x", 2)] == [[3.0], [3.0]]  # the names survived both errors
    assert fresh_pool.worker_pids == pids
    magic.torchrun_magic("--restart")
    assert magic.run_cell("'x' in globals()", 2) == [False, False]
    assert magic.run_cell("config['lr'] * rank", 2, send={"config": {"lr": 0.5}}) == [0.0, 0.5]
