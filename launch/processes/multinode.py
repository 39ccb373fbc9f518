"""The torchrun line that starts a worker on every node of a multi-node job (printed, never run here)."""

from __future__ import annotations

import json
import secrets
import shlex

RECIPE_WORKER = "hyper_parallel.recipes.worker"


def recipe_worker(recipe: str, degrees: dict[str, int], options: dict[str, int], steps: int) -> list[str]:
    """The worker part of a recipe's torchrun line (``-m hyper_parallel.recipes.worker ...``): ``degrees``
    without world_size (torchrun gives it), ``options`` the recipe's options that were not adapted (the
    worker adapts the others the same way: ``RunOptions.kept``)."""
    explicit = {k: v for k, v in degrees.items() if k != "world_size"}
    worker = ["-m", RECIPE_WORKER, "--recipe", recipe, "--degrees", json.dumps(explicit)]
    return worker + ["--options", json.dumps(options), "--steps", str(steps)]


def multinode_command(nnodes: int, nproc_per_node: int, rdzv_endpoint: str, worker: list[str]) -> str:
    """The torchrun line (c10d rendezvous) starting ``worker`` on every node; ``command`` and ``plan`` print it.

    Its ``--rdzv-id`` is new each time it is printed, so two jobs on one head node never join each
    other's rendezvous; the comment says that torch's c10d store trusts its network (docs/multi_node.md)."""
    argv = [
        "torchrun",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id=hyper-parallel-{secrets.token_hex(4)}",
        *worker,
    ]
    return (
        "# run on every node (NCCL is chosen automatically when CUDA devices are present).\n"
        "# Trusted network only: torch's c10d rendezvous store listens on every interface, without\n"
        "# authentication, and unpickles what it reads; firewall the port (docs/multi_node.md).\n"
        + " ".join(a if a.startswith("$") or "$" in a.split("=")[-1] else shlex.quote(a) for a in argv)
    )
