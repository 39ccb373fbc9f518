"""The warm pool under interrupts, slow starts and strangers (``launch.processes.pool``, ``launch.processes.pool_listener``).

* SIGINT (what Jupyter's "interrupt kernel" sends) during the cold start ends everything the start began,
  and the next run starts a new pool; during a run it ends the pool and the next run says why the names
  are gone; between runs it touches nothing (the workers run in their own session).
* ``timeout`` counts the run, not the cold start (a cold start takes 7-40 s here); the cold start has its own limit, whose error carries
  the workers' last lines.
* A local process that connects to the pool's listener first and stays silent, or answers with the
  wrong key, does not stall the start: the workers are accepted beside it and it is dropped, at the
  latest when the workers are in and the listener closes; a connection after that is refused.
* A rank that fails to join a run's process group fails the run with its own error within seconds: its
  peers, which gloo would keep waiting for it for the whole collective timeout, are ended with the pool.
* Ranks that finish a cell at once (or raise at once) do not strand peers still forming the run's group:
  gloo lets a rank out of ``connectFullMesh`` before its peers are connected, and one that freed its
  group then broke theirs (under load one 8-rank cell in two stranded a rank for 300 s).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from multiprocessing.connection import AuthenticationError, Client

import pytest
from test_pool import pool_workers

from launch.notebook import magic
from launch.processes.pool import PoolError, current, shutdown_pool

pytestmark = pytest.mark.distributed


@pytest.fixture
def fresh_pool():
    shutdown_pool()
    yield current()
    shutdown_pool()


@pytest.fixture
def interruptible():
    """SIGINT raising KeyboardInterrupt in this process, as in a kernel: a shell starts a background job
    (``cmd &`` without job control: CI scripts, ``nohup``) with SIGINT ignored, and the process inherits it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_when(condition, delay: float) -> threading.Thread:
    """SIGINT this process ``delay`` s after ``condition()`` first holds (checked every 50 ms)."""

    def wait_then_interrupt() -> None:
        deadline = time.monotonic() + 600
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=wait_then_interrupt, daemon=True)
    thread.start()
    return thread


def test_sigint_during_the_cold_start_leaves_nothing_and_the_next_run_starts_afresh(fresh_pool, interruptible):
    runs_before = fresh_pool.runs
    _interrupt_when(lambda: fresh_pool._proc is not None, 1.0)  # the agent is up, its ranks import torch
    with pytest.raises(KeyboardInterrupt):
        fresh_pool.run(2, {"kind": "code", "code": "1"}, 60)
    assert fresh_pool.runs == runs_before, "the interrupt should have landed in the start, before the first run"
    assert not fresh_pool.alive and fresh_pool.size == 0 and not pool_workers()
    assert [magic.decode(r) for r in fresh_pool.run(2, {"kind": "code", "code": "rank + 1"}, 60)[0]] == [1, 2]


def test_sigint_during_a_run_ends_the_pool_and_the_next_run_says_the_names_are_gone(fresh_pool, capsys, interruptible):
    magic.run_cell("kept = 7", 2)
    _interrupt_when(lambda: True, 2.0)
    with pytest.raises(KeyboardInterrupt):
        magic.run_cell("import time\ntime.sleep(120)", 2)
    assert not fresh_pool.alive and not pool_workers()
    assert magic.run_cell("'kept' in globals()", 2) == [False, False]
    interrupted_run = fresh_pool.runs - 1
    assert fresh_pool.restarted_because == f"KeyboardInterrupt during run {interrupted_run}"
    assert f"KeyboardInterrupt during run {interrupted_run}, so earlier names are gone" in capsys.readouterr().err


def test_sigint_between_runs_keeps_the_workers_and_their_names(fresh_pool, interruptible):
    magic.run_cell("kept = 7", 2)
    pids = fresh_pool.worker_pids
    _interrupt_when(lambda: True, 0.5)
    with pytest.raises(KeyboardInterrupt):
        time.sleep(30)
    assert magic.run_cell("kept * (rank + 1)", 2) == [7, 14]
    assert fresh_pool.worker_pids == pids and fresh_pool.restarted_because is None


def test_a_cold_start_past_its_own_limit_fails_with_the_workers_lines(fresh_pool):
    with pytest.raises(PoolError, match=r"did not connect within 0.5 s(.|\n)*start_timeout") as failure:
        fresh_pool.run(2, {"kind": "code", "code": "1"}, 60, start_timeout=0.5)
    assert "last lines" in str(failure.value) or "no output from the workers" in str(failure.value)
    assert not fresh_pool.alive and not pool_workers()


def test_strangers_are_dropped_and_the_run_timeout_does_not_include_the_cold_start(fresh_pool):
    strangers: list = []

    def connect_first() -> None:
        while fresh_pool._listener is None:
            time.sleep(0.01)
        address = fresh_pool._listener.address
        strangers.append(socket.create_connection(address))  # connects and stays silent
        try:
            Client(address, authkey=b"not the pool's key")
        except (AuthenticationError, EOFError, OSError):
            strangers.append("refused")

    thread = threading.Thread(target=connect_first, daemon=True)
    thread.start()
    started = time.monotonic()
    replies = fresh_pool.run(2, {"kind": "code", "code": "rank"}, timeout=10, start_timeout=600)[0]
    thread.join(60)
    assert [magic.decode(r) for r in replies] == [0, 1]  # the 10 s count from when the workers are up
    print(f"cold start + run: {time.monotonic() - started:.1f} s with timeout=10 (before: a start > 10 s failed)")
    assert "refused" in strangers and fresh_pool._listener.dropped >= 1
    # once the workers are in the listener is closed: the silent stranger is dropped, a later one refused
    strangers[0].settimeout(60)
    while strangers[0].recv(4096):  # the challenge, then EOF
        pass
    strangers[0].close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(fresh_pool._listener.address, timeout=10)


SABOTAGE_NEXT_JOIN = """
import torch.distributed as distributed
if rank == 1:
    real_init = distributed.init_process_group
    def init_process_group(*args, **kwargs):
        distributed.init_process_group = real_init
        raise RuntimeError("rank 1 cannot join (sabotaged by the test)")
    distributed.init_process_group = init_process_group
rank
"""


def test_a_rank_that_fails_to_join_the_group_fails_the_run_with_its_error_not_a_timeout(fresh_pool):
    assert magic.run_cell(SABOTAGE_NEXT_JOIN, 3) == [0, 1, 2]
    with pytest.raises(PoolError) as failure:
        fresh_pool.run(3, {"kind": "code", "code": "rank"}, timeout=900)  # peers would wait 300 s in gloo
    message = str(failure.value)
    assert "rank 1 failed to join the run's process group" in message and "sabotaged by the test" in message
    assert "rank(s) [0, 2] were still waiting to form the run's process group" in message
    assert failure.value.rank == 1 and not failure.value.timed_out and not failure.value.kept
    assert not fresh_pool.alive and not pool_workers()
    assert magic.run_cell("rank", 3) == [0, 1, 2]
    assert fresh_pool.restarted_because.startswith("rank 1 failed to join the run's process group in run")


RACE_RANKS, RACE_CELLS = 8, 10
RAISING_AT_ONCE = "if rank == 1:\n    raise ValueError('rank 1 raises at once')\nrank"


def test_ranks_that_finish_at_once_do_not_strand_peers_still_forming_the_group(fresh_pool):
    for index in range(RACE_CELLS):
        if index % 2:
            with pytest.raises(PoolError, match="rank 1 failed:(.|\n)*rank 1 raises at once") as failure:
                fresh_pool.run(RACE_RANKS, {"kind": "code", "code": RAISING_AT_ONCE}, timeout=600)
            assert failure.value.kept, f"cell {index}: {failure.value}"
        else:
            replies = fresh_pool.run(RACE_RANKS, {"kind": "code", "code": "rank"}, timeout=600)[0]
            assert [magic.decode(reply) for reply in replies] == list(range(RACE_RANKS)), index
