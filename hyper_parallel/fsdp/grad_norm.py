"""``clip_grad_norm_`` for a model whose gradients live on several meshes.

Under TP + fully_shard the TP'd weights' gradients are DTensors on ``(dp_replicate, fsdp, tp)`` while the
norms and the embeddings' are on ``(dp_replicate, fsdp)``; torch's ``clip_grad_norm_`` stacks the
per-gradient norms into one tensor, and DTensor refuses to stack DTensors of two meshes. Here the gradients
are grouped by mesh and placements, each group's norm is made whole (``full_tensor``: a scalar all-reduce
over the group's sharded dims), and the groups' norms are combined as torch combines per-tensor norms (the
p-norm of the norms, the max for ``inf``); torch's ``clip_grads_with_norm_`` then scales every gradient.
The result equals the single-process ``clip_grad_norm_`` of the same model (tests/test_fully_shard_tp.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator

import torch
from torch.distributed.tensor import DTensor

_REDISTRIBUTE_LOGGER = "torch.distributed.tensor._redistribute"


def clip_grad_norm_(
    parameters: torch.Tensor | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so that their total ``norm_type``-norm is at most ``max_norm``;
    returns the total norm before clipping (a plain tensor, the same on every rank). Arguments as torch's."""
    parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    groups: dict[tuple, list[torch.Tensor]] = {}  # parameters by their gradient's mesh and placements
    for param in parameters:
        if param.grad is not None:
            grad = param.grad
            key = (grad.device_mesh, tuple(grad.placements)) if isinstance(grad, DTensor) else ("local",)
            groups.setdefault(key, []).append(param)
    if not groups:
        return torch.tensor(0.0)
    norms = []
    with _quiet_redistribution():
        for params in groups.values():
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type, error_if_nonfinite, foreach)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.nn.utils.get_total_norm(norms, norm_type, error_if_nonfinite, foreach)
    for params in groups.values():  # one mesh at a time: DTensor's foreach ops refuse to mix meshes too
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach)
    return total


@contextlib.contextmanager
def _quiet_redistribution() -> Iterator[None]:
    """DTensor warns that a norm sharded on two mesh dims is made whole by two all-reduces; for one scalar
    per group that is the cheap and expected way, so the warning is held back here."""
    logger = logging.getLogger(_REDISTRIBUTE_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
