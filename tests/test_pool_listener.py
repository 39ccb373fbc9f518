"""What a stranger can hold of the pool's listener is bounded (``launch.processes.pool_listener``): at most
``MAX_PENDING`` unauthenticated connections at a time, a worker with the key still gets in beside them,
and once the listener is closed (the pool does so when its workers are in) every stranger is dropped,
its thread ends, and a later connection is refused. No worker process is started."""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from multiprocessing.connection import Client

import pytest

from launch.processes.pool_listener import MAX_PENDING, PoolListener

EXTRA = 10


def _until(condition, what: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {seconds:g} s")
        time.sleep(0.02)


def _closed(sock: socket.socket) -> bool:
    """Reads what the listener sent (its challenge) until EOF: True once the listener has closed it."""
    sock.settimeout(60)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_strangers_hold_at_most_max_pending_connections_and_nothing_once_closed():
    key = secrets.token_bytes(16)
    listener = PoolListener("127.0.0.1", key, backlog=MAX_PENDING + 2 * EXTRA)
    threads_before = threading.active_count()
    strangers = [socket.create_connection(listener.address) for _ in range(MAX_PENDING + EXTRA)]
    _until(lambda: (listener.poll(), listener.pending + listener.dropped)[1] == len(strangers), "all accepted")
    assert listener.pending == MAX_PENDING and listener.dropped == EXTRA

    worker_in = []

    def worker() -> None:
        conn = Client(listener.address, authkey=key)
        conn.send_bytes(json.dumps({"hello": 0, "pid": os.getpid()}).encode())
        worker_in.append(conn)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    _until(lambda: (listener.poll(), 0 in listener.ready)[1], "in: the worker with the key, beside the strangers")

    listener.close()
    assert all(_closed(sock) for sock in strangers)
    _until(lambda: listener.pending == 0 and threading.active_count() <= threads_before, "every stranger dropped")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(listener.address, timeout=10)
    for sock in strangers:
        sock.close()
    listener.ready[0][0].close()
    worker_in[0].close()
