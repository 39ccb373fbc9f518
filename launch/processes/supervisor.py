"""Run a script or module under ``torchrun`` on this machine and always clean up after it.

Why it works the way it does (measured with torch 2.13):

* Per-rank output: torchrun runs with ``--redirects 3 --log-dir ...`` and this module follows
  the per-rank ``stdout.log``/``stderr.log`` files itself: the file gives the rank, so nothing
  parses a prefix.  ``--tee`` instead re-prints with a ``[default0]:`` prefix and splits a line
  written in two parts, so one console line can mix ranks (``[default0]:a[default1]:b``).
* Loopback: torchrun runs through ``launch.processes.local_agent``, whose rendezvous store listens on a
  socket bound to 127.0.0.1 (plain torchrun's listens on all interfaces); gloo is pinned to the
  loopback interface.  Ports are the kernel's choice for sockets held open, so concurrent
  launches cannot collide; each launch claims its run directory (``launch.processes.run_dirs``).
* Cleanup: torchrun starts every worker in its own session, so ending torchrun's process group
  leaves workers alive.  Each descendant seen during the run is remembered (psutil) and ended
  explicitly: SIGTERM, a short grace, then SIGKILL.  If this process dies instead (SIGKILL, a
  kernel restart), the kernel ends the agent and every rank (``PR_SET_PDEATHSIG`` in
  ``launch.processes.local_agent`` and ``hyper_parallel.rank_lifetime``).
* Exits: every rank runs through ``hyper_parallel.rank_lifetime``, which records when its work
  has finished; a rank killed by a signal after that is reported as a crash at exit.
* Errors: a rank that raises records its exception in the error file torchrun's agent gives it
  (``TORCHELASTIC_ERROR_FILE``, torch's ``@record`` format); the first one written names the failed
  rank and gives its traceback (``launch.processes.failure_report``).  Without one (killed, exit code, hang),
  torchrun's summary and the rank's output do.
* Hangs: at the deadline workers first get SIGABRT; with ``PYTHONFAULTHANDLER=1`` each writes
  its Python stack to its log before dying, which shows where it was stuck.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import psutil

from hyper_parallel.rank_lifetime import ERROR_FILE_ENV, STATUS_DIR_ENV
from launch import inputs
from launch.processes.failure_report import RankError, failure, timeout_error
from launch.processes.log_layout import STDERR_LOG, STDOUT_LOG, new_log_dir, rank_log_files
from launch.processes.run_dirs import claimed, make_run_dir, new_scratch_dir

POLL_SECONDS = 0.1
PID_REFRESH_SECONDS = 0.25
STACK_DUMP_GRACE_SECONDS = 2.0
TERM_GRACE_SECONDS = 2.0
KILL_WAIT_SECONDS = 2.0
PIPE_DRAIN_SECONDS = 1.0
TORCHRUN_SHUTDOWN_SECONDS = 3  # torchrun's own SIGTERM-to-SIGKILL grace for workers (default 30)

LAUNCHER_PID_ENV = "HYPER_PARALLEL_LAUNCHER_PID"  # launch.processes.local_agent dies with this process
RENDEZVOUS_BACKEND = "hyper-parallel-loopback"  # registered by launch.processes.local_agent
LOOPBACK = "127.0.0.1"

LineCallback = Callable[[int, str], None]


@dataclass
class TorchrunResult:
    """Outcome of one launch.  ``logs[-1]`` holds torchrun's own output; ``failed_rank`` -1
    means torchrun failed (or timed out) without any rank to blame; ``rank_error`` is the failed
    rank's exception as its error file recorded it (None: ``error`` came from torchrun's summary and
    the logs, as for a rank killed by a signal, or nothing failed)."""

    ok: bool
    returncode: int
    logs: dict[int, list[str]]
    run_dir: Path
    failed_rank: int | None
    error: str | None
    timed_out: bool
    duration: float
    command: list[str]
    rank_error: RankError | None = None

    def __repr__(self) -> str:
        """Status, duration, run directory and the error's last line; ``logs`` hold the rest."""
        status = "ok" if self.ok else ("timed out" if self.timed_out else f"failed (exit {self.returncode})")
        blame = f", rank {self.failed_rank}" if self.failed_rank is not None else ""
        last = ((self.error or "").strip().splitlines() or [""])[-1][:200]
        return f"TorchrunResult({status}{blame}, {self.duration:.1f} s, {self.run_dir}" + (
            f": {last})" if last else ")"
        )


class _LineSplitter:
    """Turns a byte stream into complete text lines, holding back a trailing partial line."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[str]:
        *complete, self._pending = (self._pending + data).split(b"\n")
        return [raw.decode("utf-8", errors="replace").rstrip("\r") for raw in complete]

    def flush(self) -> list[str]:
        return self.feed(b"\n") if self._pending else []


class AgentOutput:
    """Forwards the agent's merged stdout/stderr pipe (rank -1) and the per-rank log files to ``emit``.

    ``pump`` forwards what arrives, ``drain`` the rest once the processes are gone, ``close`` releases
    the pipe and files; ``stderr`` holds each rank's stderr lines alone.  Made by ``start_agent``.
    """

    def __init__(self, pipe: BinaryIO, log_dir: Path, nproc: int, emit: LineCallback) -> None:
        self._pipe, self._log_dir, self._nproc, self._emit = pipe, log_dir, nproc, emit
        self._pipe_lines = _LineSplitter()
        self._files: dict[Path, tuple[int, BinaryIO, _LineSplitter]] = {}
        self.stderr: dict[int, list[str]] = {}  # each rank's stderr.log alone (logs mix both streams)
        self._selector = selectors.DefaultSelector()
        self._selector.register(pipe, selectors.EVENT_READ)

    def pump(self, wait: float) -> bool:
        """Forward what arrives within ``wait`` seconds; False once the pipe is at EOF."""
        pipe_open = bool(self._selector.get_map())
        if pipe_open and self._selector.select(wait):
            data = os.read(self._pipe.fileno(), 65536)
            if not data:
                self._selector.unregister(self._pipe)
                pipe_open = False
            for line in self._pipe_lines.feed(data):
                self._emit(-1, line)
        elif not pipe_open:
            time.sleep(wait)
        if len(self._files) < 2 * self._nproc:  # torchrun creates them as it starts workers
            for rank, path in rank_log_files(self._log_dir):
                if path not in self._files:
                    self._files[path] = (rank, open(path, "rb"), _LineSplitter())
            by_rank_stdout_first = sorted(self._files.items(), key=lambda kv: (kv[1][0], kv[0].name != STDOUT_LOG))
            self._files = dict(by_rank_stdout_first)
        for path, (rank, handle, lines) in self._files.items():
            for line in lines.feed(handle.read()):
                self._forward(rank, path, line)
        return pipe_open

    def _forward(self, rank: int, path: Path | None, line: str) -> None:
        if path is not None and path.name == STDERR_LOG:
            self.stderr.setdefault(rank, []).append(line)
        self._emit(rank, line)

    def drain(self, budget: float) -> None:
        """Read what is left once the processes are gone; bounded in case a stray holds the pipe."""
        deadline = time.monotonic() + budget
        while self.pump(0.05) and time.monotonic() < deadline:
            pass
        for path, (rank, _, lines) in [(None, (-1, None, self._pipe_lines)), *self._files.items()]:
            for line in lines.flush():
                self._forward(rank, path, line)

    def close(self) -> None:
        self._selector.close()
        self._pipe.close()
        for _, handle, _ in self._files.values():
            handle.close()


def _is_alive(proc: psutil.Process) -> bool:
    """Zombies count as gone: an orphaned worker may wait a while for init to reap it."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_and_wait(procs: Sequence[psutil.Process], signum: int, timeout: float) -> list[psutil.Process]:
    """Send ``signum`` to each process, then return those still alive after ``timeout``."""
    for proc in procs:
        try:
            proc.send_signal(signum)  # psutil refuses if the pid now belongs to another process
        except psutil.Error:
            pass
    deadline = time.monotonic() + timeout
    while (alive := [proc for proc in procs if _is_alive(proc)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


class ProcessTree:
    """torchrun's Popen plus every descendant seen while it ran, so none can be orphaned.

    Call ``refresh`` while it runs (it remembers new descendants), ``dump_worker_stacks`` at a
    deadline, and ``end`` always: it ends torchrun and every descendant seen.  Made by ``start_agent``.
    """

    def __init__(self, root: subprocess.Popen) -> None:
        self._root = root
        self._seen: dict[int, psutil.Process] = {}

    def refresh(self) -> None:
        try:
            for child in psutil.Process(self._root.pid).children(recursive=True):
                self._seen.setdefault(child.pid, child)
        except psutil.Error:
            pass  # torchrun already exited: keep what was seen

    def dump_worker_stacks(self) -> list[int]:
        """SIGABRT each worker (faulthandler prints its stack; no core file); return their ranks."""
        ranks, workers = set(), []
        try:
            children = psutil.Process(self._root.pid).children()
        except psutil.Error:
            return []
        for worker in children:
            try:
                ranks.add(int(worker.environ()["RANK"]))
                worker.rlimit(psutil.RLIMIT_CORE, (0, 0))
                workers.append(worker)
            except (psutil.Error, KeyError, ValueError, AttributeError):
                continue
        _signal_and_wait(workers, signal.SIGABRT, STACK_DUMP_GRACE_SECONDS)
        return sorted(ranks)

    def end(self) -> None:
        """SIGTERM torchrun and every remembered descendant, then SIGKILL what survives."""
        if self._root.poll() is None:
            self.refresh()
            self._root.terminate()
        deadline = time.monotonic() + TERM_GRACE_SECONDS
        others = _signal_and_wait([p for p in self._seen.values() if _is_alive(p)], signal.SIGTERM, TERM_GRACE_SECONDS)
        try:
            self._root.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._root.kill()
        _signal_and_wait(others, signal.SIGKILL, KILL_WAIT_SECONDS)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._root.wait(timeout=KILL_WAIT_SECONDS)


def _build_command(entry: list[str], nproc: int, args: Sequence[str], log_dir: Path) -> list[str]:
    """``launch.processes.local_agent`` (torchrun on loopback) running the entry through ``rank_lifetime``."""
    return [
        sys.executable, "-m", "launch.processes.local_agent", "--nnodes", "1", "--rdzv-backend", RENDEZVOUS_BACKEND,
        "--rdzv-endpoint", f"{LOOPBACK}:0", "--rdzv-id", uuid.uuid4().hex, "--local-addr", LOOPBACK,
        "--nproc-per-node", str(nproc), "--log-dir", str(log_dir), "--redirects", "3",
        "--shutdown-timeout", str(TORCHRUN_SHUTDOWN_SECONDS), "-m", "hyper_parallel.rank_lifetime", *entry, *args,
    ]  # fmt: skip


def _child_env(run_dir: Path, log_dir: Path, overrides: Mapping[str, str] | None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    env["HYPER_PARALLEL_RUN_DIR"] = str(run_dir)
    env[LAUNCHER_PID_ENV] = str(os.getpid())  # the agent dies with this process
    env[STATUS_DIR_ENV] = str(log_dir)  # where each rank records that its work finished
    env.pop(ERROR_FILE_ENV, None)  # a launch from inside a rank: the agent must not copy its failures into ours
    loopback = [name for name, addrs in psutil.net_if_addrs().items() if any(a.address == "127.0.0.1" for a in addrs)]
    if loopback and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = loopback[0]
    env.update({key: str(value) for key, value in (overrides or {}).items()})
    return env


def _watch(
    proc: subprocess.Popen, tree: ProcessTree, output: AgentOutput, start: float, timeout: float
) -> list[int] | None:
    """Stream output until torchrun exits (None) or the deadline passes (the ranks still running)."""
    last_refresh, exited_at = 0.0, None
    while True:
        pipe_open = output.pump(POLL_SECONDS)
        now = time.monotonic()
        if proc.poll() is not None:
            exited_at = exited_at or now
            if not pipe_open or now - exited_at > PIPE_DRAIN_SECONDS:
                return None
        elif now - start >= timeout:
            tree.refresh()
            return tree.dump_worker_stacks()
        elif now - last_refresh >= PID_REFRESH_SECONDS:
            tree.refresh()
            last_refresh = now


def torchrun(
    target: str,
    nproc: int,
    args: Sequence[str] = (),
    timeout: float = 120.0,
    on_line: LineCallback | None = None,
    env: Mapping[str, str] | None = None,
    run_dir: str | os.PathLike | None = None,
) -> TorchrunResult:
    """Run ``target`` (a .py path or a module name) on ``nproc`` local workers via torchrun.

    Every output line goes to ``on_line(rank, line)`` as it arrives (rank -1: torchrun).  On a
    failing or killed rank, a run longer than ``timeout`` seconds, or an exception in the
    caller (KeyboardInterrupt, or one raised by ``on_line``), torchrun and all its workers are
    ended before this returns or re-raises, at most about 8 s after the deadline; if this
    process dies, the kernel ends them.  Workers get ``OMP_NUM_THREADS=1`` and
    ``HYPER_PARALLEL_RUN_DIR=run_dir``; ``env`` overrides anything.  Without ``run_dir`` the run
    gets a fresh scratch directory (``launch.processes.run_dirs``); with one, it must be a folder of
    yours nobody else can write, and no other launch may be using it at the same time (``RunDirError``).
    """
    inputs.launch(target, nproc, args, timeout, on_line, env)  # before any folder is made
    run_dir = make_run_dir(run_dir) if run_dir else new_scratch_dir("run-")
    with claimed(run_dir):
        return torchrun_claimed(target, nproc, args, timeout, on_line, env, run_dir)


def torchrun_claimed(
    target: str,
    nproc: int,
    args: Sequence[str] = (),
    timeout: float = 120.0,
    on_line: LineCallback | None = None,
    env: Mapping[str, str] | None = None,
    run_dir: Path | None = None,
) -> TorchrunResult:
    """``torchrun`` into ``run_dir``, which the caller has claimed already (``launch.processes.run_dirs.claimed``)."""
    entry, timeout = inputs.launch(target, nproc, args, timeout, on_line, env)
    return _launch(entry, nproc, [str(arg) for arg in args], timeout, on_line, env, Path(run_dir))


def without_rank_prefix(rank: int, line: str) -> str:
    """A rank's line without the ``[rankN]:`` torch's distributed excepthook adds (the rank is known)."""
    prefix = f"[rank{rank}]:"
    return line[len(prefix) :].removeprefix(" ") if rank >= 0 and line.startswith(prefix) else line


def start_agent(
    entry: list[str],
    nproc: int,
    args: list[str],
    run_dir: Path,
    emit: LineCallback,
    env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen, ProcessTree, AgentOutput, Path]:
    """Start the loopback agent running ``entry`` on ``nproc`` ranks in its own session (Ctrl-C reaches us,
    not torchrun); its process tree and output follower, and its fresh log directory (never an old run's)."""
    log_dir = new_log_dir(run_dir)
    proc = subprocess.Popen(
        _build_command(entry, nproc, args, log_dir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=_child_env(run_dir, log_dir, env), start_new_session=True,
    )  # fmt: skip
    return proc, ProcessTree(proc), AgentOutput(proc.stdout, log_dir, nproc, emit), log_dir


def _launch(
    entry: list[str],
    nproc: int,
    args: list[str],
    timeout: float,
    on_line: LineCallback | None,
    env: Mapping[str, str] | None,
    run_dir: Path,
) -> TorchrunResult:
    logs: dict[int, list[str]] = {rank: [] for rank in range(-1, nproc)}

    def emit(rank: int, line: str) -> None:
        line = without_rank_prefix(rank, line)
        logs.setdefault(rank, []).append(line)
        if on_line is not None:
            on_line(rank, line)

    start = time.monotonic()
    proc, tree, output, log_dir = start_agent(entry, nproc, args, run_dir, emit, env)
    try:
        try:
            running_ranks = _watch(proc, tree, output, start, timeout)
        finally:
            tree.end()
        output.drain(PIPE_DRAIN_SECONDS)
    finally:
        output.close()

    timed_out = running_ranks is not None
    returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    failed_rank, error, rank_error = None, None, None
    if timed_out:
        failed_rank = running_ranks[0] if running_ranks else -1
        error = timeout_error(logs, running_ranks, timeout)
    elif returncode != 0:
        failed = failure(logs, output.stderr, returncode, log_dir)
        failed_rank, error, rank_error = failed.rank, failed.error, failed.rank_error
    return TorchrunResult(
        ok=returncode == 0 and not timed_out, returncode=returncode, logs=logs, run_dir=run_dir,
        failed_rank=failed_rank, error=error, timed_out=timed_out,
        duration=time.monotonic() - start, command=list(proc.args), rank_error=rank_error,
    )  # fmt: skip
