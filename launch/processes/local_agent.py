"""torchrun for one machine that listens on loopback only and dies with the process that launched it.

    python -m launch.processes.local_agent <torchrun arguments>     (started by ``launch.processes.supervisor``)

Two things plain ``torchrun --standalone`` does not do (measured with torch 2.13):

* Loopback only.  Its TCPStore servers listen on every interface (``*:port``) whatever
  ``--local-addr``/``--rdzv-endpoint`` say.  This agent registers a rendezvous backend,
  ``hyper-parallel-loopback``, that binds the store's socket to 127.0.0.1 itself and hands it to
  ``TCPStore(master_listen_fd=...)``; that store is the only one: the workers use it as their
  ``MASTER_ADDR:MASTER_PORT`` (the agent's store) and gloo listens on the loopback interface.
  The port is the kernel's choice for a socket this process holds, so concurrent launches
  never race for one.  Multi-node runs use plain torchrun with an explicit endpoint
  (``python -m launch command``).
* Dies with its launcher.  The supervisor starts torchrun in its own session (so Ctrl-C reaches
  the supervisor only); ``PR_SET_PDEATHSIG`` makes the kernel SIGKILL this agent when the
  launcher is gone, however it ended.  Each worker does the same towards this agent
  (``hyper_parallel.rank_lifetime``), so no rank outlives it.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)
from torch.distributed.run import get_args_parser
from torch.distributed.run import main as torchrun_main

from hyper_parallel.rank_lifetime import AGENT_PID_ENV, die_with_parent
from launch.processes.supervisor import LAUNCHER_PID_ENV, LOOPBACK, RENDEZVOUS_BACKEND

STORE_TIMEOUT = datetime.timedelta(minutes=10)


class LoopbackRendezvous(RendezvousHandler):
    """One node; its TCPStore listens on a socket this process bound to 127.0.0.1 (the only server)."""

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id
        self._store: TCPStore | None = None

    def get_backend(self) -> str:
        return RENDEZVOUS_BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True  # workers connect to this store instead of rank 0 starting another server

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((LOOPBACK, 0))
            port = listener.getsockname()[1]
            self._store = TCPStore(
                LOOPBACK,
                port,
                None,
                True,
                STORE_TIMEOUT,
                wait_for_workers=False,
                multi_tenant=True,
                master_listen_fd=listener.detach(),
            )
        return RendezvousInfo(
            PrefixStore(self._run_id, self._store), 0, 1, RendezvousStoreInfo(LOOPBACK, self._store.port)
        )

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        return True


def create_handler(params: RendezvousParameters) -> LoopbackRendezvous:
    if params.max_nodes != 1:
        raise ValueError(f"{RENDEZVOUS_BACKEND} runs one node; got --nnodes {params.max_nodes}")
    return LoopbackRendezvous(params.run_id)


def main(argv: list[str]) -> None:
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if launcher:
        die_with_parent(int(launcher))
    os.environ[AGENT_PID_ENV] = str(os.getpid())  # inherited by the workers, which watch this process
    rendezvous_handler_registry.register(RENDEZVOUS_BACKEND, create_handler)
    torchrun_main(without_unknown_shutdown_timeout(argv))


def without_unknown_shutdown_timeout(argv: list[str]) -> list[str]:
    """``argv`` less ``--shutdown-timeout N`` where this torchrun has no such flag (torch 2.11's, which the
    CUDA images ``make gpu-smoke`` meets ship): its workers then get torchrun's default grace."""
    if "--shutdown-timeout" not in argv or "--shutdown-timeout" in get_args_parser()._option_string_actions:
        return argv
    at = argv.index("--shutdown-timeout")
    return argv[:at] + argv[at + 2 :]


if __name__ == "__main__":
    main(sys.argv[1:])
