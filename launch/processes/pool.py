"""The warm pool: torchrun workers that stay up between runs, so a notebook relaunches in a fraction of
a second instead of paying torchrun, N interpreters importing torch and a rendezvous every time.

    pool = launch.processes.pool.current()           # one per Python process, started on first use
    replies = pool.run(2, {"kind": "recipes", "specs": [...]}, timeout=600, on_line=print)
    launch.shutdown_pool()                 # also at interpreter exit

The workers (``launch.processes.pool_worker``) run under the same loopback agent as every launch
(``launch.processes.local_agent``: dies with this process, listens on 127.0.0.1 only) and talk to this process
over an authenticated local connection (``launch.processes.pool_listener``; JSON messages; only values a cell
returns travel as ``torch.save`` bytes, read back with ``weights_only=True``). The pool grows to the
largest world size asked for (starting at ``min_size`` at least); a smaller run uses ranks 0..n-1. One machine only (docs/multi_node.md).

What ends the pool, and what does not (docs/warm_pool.md):

* A Python exception on one or all ranks is reported (``PoolError``, ``kept=True``) and the pool stays
  up with every name a ``%%torchrun`` cell defined: each rank finished its task and freed its groups.
* A rank that died or hung past the timeout, an interrupt during a run, the agent's end, or growing to
  more ranks end it with every process; the next run starts a new pool and ``restarted_because``
  says why the names are gone.
* ``timeout`` counts the run only; the cold start has its own limit (``start_timeout``, default
  ``$HYPER_PARALLEL_POOL_START_TIMEOUT`` or 300 s), and its failure carries the workers' last lines.
* An interrupt during the cold start ends everything it started (nothing is left half-up).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import secrets
import subprocess
import threading
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import psutil

from launch import inputs
from launch.processes.failure_report import PEER_LOSS, exit_of, timeout_error
from launch.processes.log_layout import write_pool_logs
from launch.processes.pool_listener import ADDRESS_ENV, KEY_ENV, RENDEZVOUS, PoolListener
from launch.processes.run_dirs import claimed, new_scratch_dir
from launch.processes.supervisor import (
    LOOPBACK,
    AgentOutput,
    LineCallback,
    ProcessTree,
    TorchrunResult,
    start_agent,
    without_rank_prefix,
)

WORKER_MODULE = "launch.processes.pool_worker"
POLL_SECONDS = 0.05
LOG_TAIL_LINES = 20
AGENT_SUMMARY_SECONDS = 10.0
"""How long to wait for torchrun's failure summary after a rank died (it first stops the others, 3 s each)."""
NAMES_GONE = "the warm workers were ended, so names defined by earlier %%torchrun cells are gone"
RENDEZVOUS_GRACE_SECONDS = 5.0
"""How long the other ranks may take to fail on their own once one failed to join the run's process group:
a rank whose peer left before connecting to it waits in gloo's ``connectFullMesh`` for the whole collective
timeout (300 s), so the pool ends them after this."""


class PoolError(RuntimeError):
    """A run on the pool failed; ``rank`` is the rank to blame (-1: none), ``logs`` every rank's lines,
    ``kept`` whether the pool (and a cell's names) survived it, ``timed_out`` whether the run passed its
    timeout."""

    def __init__(
        self, message: str, rank: int, logs: dict[int, list[str]], kept: bool = False, timed_out: bool = False
    ) -> None:
        super().__init__(message)
        self.rank, self.logs, self.kept, self.timed_out = rank, logs, kept, timed_out


def _tails(logs: dict[int, list[str]]) -> str:
    """The last lines of every rank (-1: the agent), for an error a user can act on."""
    parts = []
    for rank, lines in sorted(logs.items()):
        if lines:
            label = "agent (torchrun)" if rank < 0 else f"rank {rank}"
            parts.append(f"--- {label}, last lines:\n" + "\n".join(lines[-LOG_TAIL_LINES:]))
    return "\n".join(parts) or "(no output from the workers)"


def _is_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Pool:
    def __init__(self) -> None:
        self.size = 0
        self.min_size = 1
        """Workers a start brings up at least: a kernel that knows the largest world size it will ask for
        (``make workbook``'s, ``launch.notebook.workbook_kernel``) starts them all at once, as growing the
        pool later ends it and pays a second cold start."""
        self.runs = 0
        self.ended_because: str | None = None
        """Why the last pool ended (None: none ended, or it was ended on purpose by ``shutdown``)."""
        self.restarted_because: str | None = None
        """Set by the run that started a new pool after one ``ended_because``; cleared by the next run."""
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._tree: ProcessTree | None = None
        self._output: AgentOutput | None = None
        self._conns: dict[int, Connection] = {}
        self._pids: dict[int, int] = {}
        self._listener: PoolListener | None = None
        self._claim: contextlib.ExitStack | None = None
        self._on_line: LineCallback | None = None
        self._logs: dict[int, list[str]] = {}
        self.run_dir: Path | None = None

    # ----- lifecycle -----
    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def worker_pids(self) -> dict[int, int]:
        """Each rank's process id (what ``launch.processes.pool_health`` counts threads and fds of)."""
        return dict(self._pids)

    def _emit(self, rank: int, line: str) -> None:
        line = without_rank_prefix(rank, line)
        self._logs.setdefault(rank, []).append(line)
        if self._on_line is not None:
            self._on_line(rank, line)

    def _start(self, size: int, start_timeout: float) -> None:
        """Start ``size`` workers; anything raised here (an interrupt included) ends what was started."""
        try:
            key = secrets.token_bytes(16)
            self._listener = PoolListener(LOOPBACK, key, backlog=size + 8)
            host, port = self._listener.address
            self.run_dir = new_scratch_dir("pool-")
            self._claim = contextlib.ExitStack()
            self._claim.enter_context(claimed(self.run_dir))  # never pruned while the pool lives
            self._logs = {}
            self._proc, self._tree, self._output, _ = start_agent(
                ["-m", WORKER_MODULE],
                size,
                [],
                self.run_dir,
                self._emit,
                {ADDRESS_ENV: f"{host}:{port}", KEY_ENV: key.hex()},
            )
            deadline = time.monotonic() + start_timeout
            while len(self._listener.ready) < size:
                self._output.pump(POLL_SECONDS)
                self._tree.refresh()
                self._listener.poll()
                if not self.alive:
                    self._output.drain(1.0)
                    raise PoolError(
                        f"the pool's agent (torchrun) exited before its {size} workers connected:\n"
                        + _tails(self._logs),
                        -1,
                        self._logs,
                    )
                if time.monotonic() > deadline:
                    raise PoolError(
                        f"the pool's {size} workers did not connect within {start_timeout:g} s (the cold-start "
                        f"limit: start_timeout=..., or ${inputs.START_TIMEOUT_ENV}, raises it on a slow machine); "
                        f"{len(self._listener.ready)} had connected.\n" + _tails(self._logs),
                        -1,
                        self._logs,
                    )
            self._listener.close()  # every worker is in: nobody else may connect, or stay connected
            ready = dict(self._listener.ready)
            self._conns = {rank: conn for rank, (conn, _) in ready.items()}
            self._pids = {rank: pid for rank, (_, pid) in ready.items()}
            self.size = size  # only once every worker is connected
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """End every worker and the agent (idempotent)."""
        for conn in self._conns.values():
            with contextlib.suppress(OSError):
                conn.send_bytes(json.dumps({"kind": "exit"}).encode())
        if self._tree is not None:
            self._tree.end()
        if self._output is not None:
            self._output.close()
        if self._listener is not None:
            self._listener.close()
        for conn in self._conns.values():
            conn.close()
        if self._claim is not None:
            self._claim.close()
        self._proc = self._tree = self._output = self._listener = self._claim = None
        self._conns, self._pids, self.size = {}, {}, 0

    def _end(self, reason: str) -> None:
        """End the pool because of ``reason`` (the next run says so)."""
        self.shutdown()
        self.ended_because = reason

    def _check_before_run(self, world_size: int) -> None:
        """End a pool that cannot serve this run (an agent or rank gone, too few ranks), saying why."""
        if self._proc is None:
            return
        if not self.alive:
            self._end("the pool's agent (torchrun) had ended since the last run")
        elif dead := [rank for rank, pid in sorted(self._pids.items()) if not _is_running(pid)]:
            self._end(f"rank(s) {dead} had ended since the last run (killed from outside?)")
        elif self.size < world_size:
            self._end(f"a run on {world_size} ranks needed more than the pool's {self.size}")

    def warm_up(self, size: int, start_timeout: float | None = None) -> None:
        """Start ``size`` workers (at least ``min_size``) now unless they are up, so that the next run does
        not pay their start: ``make workbook`` warms the kernel of its last, timed notebook this way while
        the others finish (``launch.notebook.workbook``)."""
        size = inputs.rank_count(size, "size")
        start_limit = inputs.start_timeout(start_timeout)
        with self._lock:
            self._serving(size, start_limit)

    def _serving(self, world_size: int, start_limit: float) -> None:
        """A pool that can serve ``world_size`` ranks: one that cannot is ended and a new one started (with
        at least ``min_size`` workers; ``restarted_because`` then says why the old one ended)."""
        self._check_before_run(world_size)
        if not self.alive:
            self._start(max(world_size, self.min_size), start_limit)
            self.restarted_because, self.ended_because = self.ended_because, None

    # ----- runs -----
    def run(
        self,
        world_size: int,
        task: dict[str, Any],
        timeout: float,
        on_line: LineCallback | None = None,
        start_timeout: float | None = None,
    ) -> tuple[list[dict], dict[int, list[str]], float]:
        """Run ``task`` on ranks 0..world_size-1 (started or grown first); every rank's reply, every rank's
        lines of this run, and the seconds the run took (after the start). ``PoolError`` on failure."""
        world_size = inputs.rank_count(world_size, "world_size")
        timeout = inputs.timeout(timeout)
        start_limit = inputs.start_timeout(start_timeout)
        with self._lock:
            self.restarted_because = None
            self._serving(world_size, start_limit)
            self.runs += 1
            self._logs, self._on_line = {}, on_line
            start = time.monotonic()  # the run's deadline: the cold start above has its own
            message = json.dumps({**task, "world_size": world_size, "prefix": f"hp-pool-run{self.runs}/"}).encode()
            try:
                for conn in self._conns.values():
                    conn.send_bytes(message)
                replies = self._collect(start + timeout, timeout)
            except PoolError:
                raise
            except BaseException as error:  # an interrupt (or a failing on_line): the ranks are mid-task
                self._end(f"{type(error).__name__} during run {self.runs}")
                raise
            finally:
                self._on_line = None
            if (first := _blame(replies)) is not None:
                raise PoolError(
                    f"rank {first} failed:\n{replies[first]['traceback']}\n"
                    f"(every rank finished its task: the warm workers and their names are kept)",
                    first,
                    self._logs,
                    kept=True,
                )
            return [replies[rank] for rank in range(world_size)], self._logs, time.monotonic() - start

    def forget_names(self, timeout: float = 60.0) -> None:
        """Drop every name the ``%%torchrun`` cells defined on the ranks, keeping the workers up: what a
        kernel that goes on to another notebook does (``make workbook`` runs several in one kernel)."""
        with self._lock:
            if not self.alive:
                return
            self._logs, self._on_line = {}, None
            for conn in self._conns.values():
                conn.send_bytes(json.dumps({"kind": "forget"}).encode())
            self._collect(time.monotonic() + timeout, timeout)

    def _fail(self, reason: str, message: str, rank: int, timed_out: bool = False) -> PoolError:
        logs = self._logs
        self._end(reason)
        return PoolError(f"{message}\n({NAMES_GONE}; the next run starts new ones)", rank, logs, timed_out=timed_out)

    def _collect(self, deadline: float, timeout: float) -> dict[int, dict]:
        """Every rank's reply; ``PoolError`` (the pool ended) when a rank dies, when ranks are left waiting
        for one that failed to join the run's group, or at the deadline."""
        replies: dict[int, dict] = {}
        waiting = dict(self._conns)
        stranded_since = None  # when a rank failed to join the run's group, leaving the others waiting for it
        while waiting:
            self._output.pump(0.0)
            for conn in wait(list(waiting.values()), timeout=POLL_SECONDS):
                rank = next(r for r, c in waiting.items() if c is conn)
                try:
                    replies[rank] = json.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    raise self._died(rank) from None
                del waiting[rank]
                if stranded_since is None and replies[rank].get("stage") == RENDEZVOUS:
                    stranded_since = time.monotonic()
            now = time.monotonic()
            if waiting and stranded_since is not None and now - stranded_since > RENDEZVOUS_GRACE_SECONDS:
                raise self._stranded(replies, sorted(waiting))
            if waiting and now > deadline:
                raise self._timed_out(sorted(waiting), timeout)
        self._output.pump(0.05)
        return replies

    def _died(self, rank: int) -> PoolError:
        """A rank's connection closed mid-run: its process ended. torchrun then ends the others and prints
        how each ended, which names the signal that killed it."""
        agent_alive = self.alive
        self._output.drain(AGENT_SUMMARY_SECONDS)
        how = exit_of(self._logs.get(-1, []), rank) or "its process ended"
        who = f"rank {rank}" if agent_alive else f"the pool's agent (torchrun) and rank {rank}"
        return self._fail(
            f"{who} died during run {self.runs} ({how})",
            f"{who} died during the run ({how}):\n" + "\n".join(self._logs.get(rank, [])[-LOG_TAIL_LINES:]),
            rank,
        )

    def _stranded(self, replies: dict[int, dict], waiting: list[int]) -> PoolError:
        """The error of a run whose group could not form: the first rank's own error, every other failed
        rank's last line, and the ranks still waiting (ended with the pool)."""
        first = _blame(replies)
        what = "failed to join the run's process group" if replies[first].get("stage") == RENDEZVOUS else "failed"
        others = "".join(
            f"\nrank {rank}: {reply['traceback'].strip().splitlines()[-1]}"
            for rank, reply in sorted(replies.items())
            if not reply["ok"] and rank != first
        )
        return self._fail(
            f"rank {first} {what} in run {self.runs}",
            f"rank {first} {what}:\n{replies[first]['traceback']}{others}\n"
            f"rank(s) {waiting} were still waiting to form the run's process group {RENDEZVOUS_GRACE_SECONDS:g} s "
            f"later (gloo waits for a peer that left for the whole collective timeout), so every worker was ended",
            first,
        )

    def _timed_out(self, waiting: list[int], timeout: float) -> PoolError:
        self._tree.refresh()
        self._tree.dump_worker_stacks()
        self._output.drain(1.0)
        return self._fail(
            f"run {self.runs} timed out", timeout_error(self._logs, waiting, timeout), min(waiting), timed_out=True
        )


def _blame(replies: dict[int, dict]) -> int | None:
    """The rank whose failure to report: one that raised on its own, not one whose peer's group went away
    (gloo's error); None when every rank succeeded."""
    failed = [rank for rank, reply in sorted(replies.items()) if not reply["ok"]]
    lost_a_peer = [rank for rank in failed if any(marker in replies[rank]["traceback"] for marker in PEER_LOSS)]
    return next((rank for rank in failed if rank not in lost_a_peer), failed[0] if failed else None)


_POOL: Pool | None = None


def current() -> Pool:
    """This process's pool (created on first use; its workers start with the first run)."""
    global _POOL
    if _POOL is None:
        _POOL = Pool()
        atexit.register(shutdown_pool)
    return _POOL


def run_as_launch(
    world_size: int, task: dict[str, Any], timeout: float, on_line: LineCallback | None, run_dir: Path
) -> TorchrunResult:
    """``task`` on this process's pool, reported like a torchrun launch: its logs in ``run_dir`` as a
    launch's, a ``PoolError`` as a failed launch (whether the pool survives it is ``Pool.run``'s rule)."""
    start = time.monotonic()
    failure: PoolError | None = None
    try:
        _, logs, seconds = current().run(world_size, task, timeout, on_line)
    except PoolError as error:
        failure, logs, seconds = error, error.logs, time.monotonic() - start
    write_pool_logs(run_dir, logs, world_size)
    return TorchrunResult(
        ok=failure is None,
        returncode=0 if failure is None else 1,
        logs=logs,
        run_dir=run_dir,
        failed_rank=None if failure is None else failure.rank,
        error=None if failure is None else str(failure),
        timed_out=failure is not None and failure.timed_out,
        duration=seconds,
        command=["warm pool"],
    )


def shutdown_pool() -> None:
    """End the warm workers now (the next run starts new ones)."""
    if _POOL is not None:
        _POOL.shutdown()
        _POOL.ended_because = None
