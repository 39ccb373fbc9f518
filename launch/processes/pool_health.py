"""What each warm worker holds and burns: threads, open fds, listening sockets, CPU while idle.

A pool meant to stay open all day must hold after run N what it held after run 2 (``launch.processes.pool_worker``
releases every group a run made) and use no CPU between runs. ``python -m launch bench-latency``
prints these counts; tests/test_pool_soak.py holds them to that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from launch.processes.pool import Pool


@dataclass(frozen=True)
class WorkerResources:
    rank: int
    threads: int
    fds: int
    listening: int
    """TCP sockets in LISTEN state (each live gloo group holds some)."""
    rss_mib: float
    """Resident memory: what a run leaves behind that no count of threads or fds shows."""


def worker_resources(pool: Pool) -> list[WorkerResources]:
    """Each rank's counts now, by rank (a rank that has ended is left out)."""
    found = []
    for rank, pid in sorted(pool.worker_pids.items()):
        try:
            process = psutil.Process(pid)
            listening = sum(1 for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN)
            found.append(
                WorkerResources(
                    rank, process.num_threads(), process.num_fds(), listening, process.memory_info().rss / 2**20
                )
            )
        except psutil.Error:
            continue
    return found


def idle_cpu_percent(pool: Pool, seconds: float = 10.0) -> dict[int, float]:
    """Each rank's CPU use over ``seconds`` of doing nothing, in % of one core."""
    processes = {}
    for rank, pid in pool.worker_pids.items():
        try:
            processes[rank] = psutil.Process(pid)
            processes[rank].cpu_percent(None)
        except psutil.Error:
            continue
    time.sleep(seconds)
    usage = {}
    for rank, process in processes.items():
        try:
            usage[rank] = process.cpu_percent(None)
        except psutil.Error:
            continue
    return usage
