"""Where the warm pool's workers connect: 127.0.0.1, an HMAC challenge, and no waiting on strangers.

``multiprocessing.connection.Listener`` accepts one connection at a time, with a backlog of 1, and runs
the authentication challenge inside ``accept()`` with no timeout: any local process that connects
first and stays silent stalls the pool's start. Here the listening socket has a backlog for every
worker and polls without blocking; each connection is authenticated in its own thread (the same
challenge ``Listener`` uses, with the pool's random key), and one that has not authenticated and said
hello within ``HANDSHAKE_SECONDS`` is dropped (its socket shut down), as is one with a wrong key.

What a stranger can hold is bounded: at most ``MAX_PENDING`` unauthenticated connections at a time (a
newcomer drops the oldest, so workers still get in), each for at most ``HANDSHAKE_SECONDS``, and only
while the pool starts: the
pool closes the listener once its workers are in (``close``), which drops every connection still
pending and refuses any later one.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from multiprocessing.connection import AuthenticationError, Connection, answer_challenge, deliver_challenge

# How a worker finds the listener: set by ``pool.Pool`` for every rank, read by ``pool_worker``.
ADDRESS_ENV, KEY_ENV = "HYPER_PARALLEL_POOL_ADDRESS", "HYPER_PARALLEL_POOL_KEY"
RENDEZVOUS = "rendezvous"
"""A failed reply's ``stage`` when the rank failed while joining the run's process group."""
HANDSHAKE_SECONDS = 30.0
HELLO_MAX_BYTES = 4096
MAX_PENDING = 64


class PoolListener:
    """Accepts workers on ``address``; ``ready`` maps each authenticated rank to (connection, pid)."""

    def __init__(self, host: str, key: bytes, backlog: int) -> None:
        self._socket = socket.create_server((host, 0), backlog=backlog)
        self._socket.setblocking(False)
        self.address: tuple[str, int] = self._socket.getsockname()[:2]
        self._key = key
        self._lock = threading.Lock()
        self._pending: dict[Connection, float] = {}
        self.ready: dict[int, tuple[Connection, int]] = {}
        self.dropped = 0

    def poll(self) -> None:
        """Take the connections waiting in the backlog and drop those too slow to authenticate."""
        while True:
            try:
                client, _ = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                break
            with self._lock:
                oldest = (
                    min(self._pending, key=self._pending.__getitem__) if len(self._pending) >= MAX_PENDING else None
                )
            if oldest is not None:
                self._drop(oldest)  # room for the newcomer: a worker answers within milliseconds of connecting
            client.setblocking(True)
            conn = Connection(client.detach())
            with self._lock:
                self._pending[conn] = time.monotonic()
            threading.Thread(target=self._handshake, args=(conn,), daemon=True).start()
        now = time.monotonic()
        with self._lock:
            stale = [conn for conn, since in self._pending.items() if now - since > HANDSHAKE_SECONDS]
        for conn in stale:
            self._drop(conn)

    def _handshake(self, conn: Connection) -> None:
        try:
            deliver_challenge(conn, self._key)
            answer_challenge(conn, self._key)
            hello = json.loads(conn.recv_bytes(HELLO_MAX_BYTES))
            rank, pid = int(hello["hello"]), int(hello["pid"])
        except (AuthenticationError, EOFError, OSError, ValueError, KeyError, TypeError):
            self._drop(conn)
            with contextlib.suppress(OSError):
                conn.close()
            return
        with self._lock:
            if self._pending.pop(conn, None) is not None and rank not in self.ready:
                self.ready[rank] = (conn, pid)
                return
        self._drop(conn)

    def _drop(self, conn: Connection) -> None:
        """Shut the socket down (this wakes a handshake thread blocked on it, which then closes it)."""
        with self._lock:
            if self._pending.pop(conn, None) is not None:
                self.dropped += 1
        with contextlib.suppress(OSError, ValueError):
            duplicate = socket.socket(fileno=os.dup(conn.fileno()))
            with contextlib.suppress(OSError):
                duplicate.shutdown(socket.SHUT_RDWR)
            duplicate.close()

    @property
    def pending(self) -> int:
        """Connections accepted and not yet authenticated (each holds a thread and a socket)."""
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Stop listening and drop every connection not yet authenticated (``ready`` ones are the caller's)."""
        self._socket.close()
        with self._lock:
            pending = list(self._pending)
        for conn in pending:
            self._drop(conn)
