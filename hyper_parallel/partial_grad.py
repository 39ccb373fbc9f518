"""The mark a model-parallel style puts on a parameter whose gradient is partial over some mesh dims.

A style that computes on local tensors (Megatron-style TP/SP, the router of an EP layer whose tokens are
split over tp) leaves the gradient of a parameter that is replicated over a dim but saw different data
on each of its ranks as a per-rank partial sum. The style marks the parameter; ``fully_shard`` sums such
gradients over the marked dims after its data-parallel reduction. Both layers import this module; neither
reaches into the other.
"""

from __future__ import annotations

import torch

PARTIAL_GRAD_ATTR = "_hp_partial_grad_dims"


def mark_partial(param: torch.Tensor, dim: str) -> None:
    """Record that ``param``'s gradient is partial over mesh dim ``dim`` (idempotent)."""
    dims = marked_partial_dims(param)
    if dim not in dims:
        setattr(param, PARTIAL_GRAD_ATTR, dims + (dim,))


def marked_partial_dims(param: torch.Tensor) -> tuple[str, ...]:
    return tuple(getattr(param, PARTIAL_GRAD_ATTR, ()))
