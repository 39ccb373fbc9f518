"""The torchrun line that starts a worker on every node of a multi-node job (printed, never run here)."""

from __future__ import annotations

import secrets
import shlex


def new_rdzv_id() -> str:
    """A rendezvous id no other job shares, so two jobs on one head node never join each other's rendezvous."""
    return f"hyper-parallel-{secrets.token_hex(4)}"


def multinode_command(
    nnodes: int, nproc_per_node: int, rdzv_endpoint: str, worker: list[str], rdzv_id: str | None = None
) -> str:
    """The torchrun line (c10d rendezvous) starting ``worker`` on every node; ``command`` and ``plan`` print it.

    Its ``--rdzv-id`` is new each time it is printed unless given (``new_rdzv_id``); the comment says that
    torch's c10d store trusts its network (docs/multi_node.md)."""
    argv = [
        "torchrun",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={rdzv_id or new_rdzv_id()}",
        *worker,
    ]
    return (
        "# run on every node (NCCL is chosen automatically when CUDA devices are present).\n"
        "# Trusted network only: torch's c10d rendezvous store listens on every interface, without\n"
        "# authentication, and unpickles what it reads; firewall the port (docs/multi_node.md).\n"
        + " ".join(a if a.startswith("$") or "$" in a.split("=")[-1] else shlex.quote(a) for a in argv)
    )
