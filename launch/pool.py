"""The warm pool: torchrun workers that stay up between runs, so a notebook relaunches in a fraction of
a second instead of paying torchrun, N interpreters importing torch and a rendezvous every time.

    pool = launch.pool.current()           # one per Python process, started on first use
    replies = pool.run(2, {"kind": "recipes", "specs": [...]}, timeout=600, on_line=print)
    launch.shutdown_pool()                 # also at interpreter exit

The workers (``launch.pool_worker``) run under the same loopback agent as every launch
(``launch.local_agent``: dies with this process, listens on 127.0.0.1 only) and talk to this process
over an authenticated local connection (JSON messages; only values a cell returns travel as
``torch.save`` bytes, read back with ``weights_only=True``). The pool grows to the largest world size
asked for; a smaller run uses ranks 0..n-1. Whatever goes wrong (a rank raises, dies, or runs past the
timeout) is reported as a fresh launch would report it and the pool is torn down with every process:
the next run starts a new one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import secrets
import subprocess
import threading
import time
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path
from typing import Any

from launch.failure_report import timeout_error
from launch.run_dirs import new_scratch_dir
from launch.supervisor import LOOPBACK, AgentOutput, LineCallback, ProcessTree, start_agent, without_rank_prefix

WORKER_MODULE = "launch.pool_worker"
ADDRESS_ENV, KEY_ENV = "HYPER_PARALLEL_POOL_ADDRESS", "HYPER_PARALLEL_POOL_KEY"  # read by launch.pool_worker
START_TIMEOUT = 300.0
POLL_SECONDS = 0.05


class PoolError(RuntimeError):
    """A run on the pool failed; ``rank`` is the rank to blame (-1: none), ``logs`` every rank's lines."""

    def __init__(self, message: str, rank: int, logs: dict[int, list[str]]) -> None:
        super().__init__(message)
        self.rank, self.logs = rank, logs


class Pool:
    def __init__(self) -> None:
        self.size = 0
        self.runs = 0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._tree: ProcessTree | None = None
        self._output: AgentOutput | None = None
        self._conns: dict[int, Connection] = {}
        self._listener: Listener | None = None
        self._on_line: LineCallback | None = None
        self._logs: dict[int, list[str]] = {}
        self.run_dir: Path | None = None

    # ----- lifecycle -----
    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _emit(self, rank: int, line: str) -> None:
        line = without_rank_prefix(rank, line)
        self._logs.setdefault(rank, []).append(line)
        if self._on_line is not None:
            self._on_line(rank, line)

    def _start(self, size: int) -> None:
        key = secrets.token_bytes(16)
        self._listener = Listener((LOOPBACK, 0), authkey=key)
        host, port = self._listener.address
        self.run_dir = new_scratch_dir("pool-")
        self._proc, self._tree, self._output, _ = start_agent(
            ["-m", WORKER_MODULE],
            size,
            [],
            self.run_dir,
            self._emit,
            {ADDRESS_ENV: f"{host}:{port}", KEY_ENV: key.hex()},
        )
        self._logs, self._conns, self.size = {}, {}, size
        accepted: list[Connection] = []
        thread = threading.Thread(
            target=lambda: [accepted.append(self._listener.accept()) for _ in range(size)], daemon=True
        )
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while len(accepted) < size:
            self._output.pump(POLL_SECONDS)
            self._tree.refresh()
            if not self.alive or time.monotonic() > deadline:
                self.shutdown()
                raise PoolError(f"the pool's {size} workers did not start", -1, self._logs)
        for conn in accepted:
            hello = json.loads(conn.recv_bytes())
            self._conns[hello["hello"]] = conn

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
        self._proc = self._tree = self._output = self._listener = None
        self._conns, self.size = {}, 0

    # ----- runs -----
    def run(
        self, world_size: int, task: dict[str, Any], timeout: float, on_line: LineCallback | None = None
    ) -> tuple[list[dict], dict[int, list[str]], float]:
        """Run ``task`` on ranks 0..world_size-1 (started or grown first); every rank's reply, every rank's
        lines of this run, and the seconds it took. ``PoolError`` (after tearing the pool down) on failure."""
        with self._lock:
            start = time.monotonic()
            if not self.alive or self.size < world_size:
                self.shutdown()
                self._start(world_size)
            self.runs += 1
            self._logs, self._on_line = {}, on_line
            message = json.dumps({**task, "world_size": world_size, "prefix": f"hp-pool-run{self.runs}/"}).encode()
            try:
                for conn in self._conns.values():
                    conn.send_bytes(message)
                replies = self._collect(start + timeout, timeout)
            except BaseException:
                self.shutdown()
                raise
            finally:
                self._on_line = None
            failed = [rank for rank, reply in sorted(replies.items()) if not reply["ok"]]
            if failed:
                logs = self._logs
                self.shutdown()
                raise PoolError(f"rank {failed[0]} failed:\n{replies[failed[0]]['traceback']}", failed[0], logs)
            return [replies[rank] for rank in range(world_size)], self._logs, time.monotonic() - start

    def _collect(self, deadline: float, timeout: float) -> dict[int, dict]:
        replies: dict[int, dict] = {}
        waiting = dict(self._conns)
        while waiting:
            self._output.pump(0.0)
            for conn in wait(list(waiting.values()), timeout=POLL_SECONDS):
                rank = next(r for r, c in waiting.items() if c is conn)
                try:
                    replies[rank] = json.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    self._output.drain(1.0)
                    logs = self._logs
                    self.shutdown()
                    raise PoolError(
                        f"rank {rank} died (its process ended during the run):\n" + "\n".join(logs.get(rank, [])[-20:]),
                        rank,
                        logs,
                    ) from None
                del waiting[rank]
            if waiting and time.monotonic() > deadline:
                self._tree.refresh()
                self._tree.dump_worker_stacks()
                self._output.drain(1.0)
                logs = self._logs
                self.shutdown()
                raise PoolError(timeout_error(logs, sorted(waiting), timeout), min(waiting), logs)
        self._output.pump(0.05)
        return replies


_POOL: Pool | None = None


def current() -> Pool:
    """This process's pool (created on first use; its workers start with the first run)."""
    global _POOL
    if _POOL is None:
        _POOL = Pool()
        atexit.register(shutdown_pool)
    return _POOL


def shutdown_pool() -> None:
    """End the warm workers now (the next run starts new ones)."""
    if _POOL is not None:
        _POOL.shutdown()
