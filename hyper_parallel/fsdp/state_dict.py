"""State dicts of fully_shard modules.

The sharded state dict is simply ``module.state_dict()``: between steps every managed parameter is
its sharded DTensor, and ``module.load_state_dict`` copies DTensors of the same layout in place
(into the flat shard buffer). The full state dict gathers every parameter (``full_tensor()``, a
collective: call it on every rank); loading one cuts each full tensor back to this rank's piece.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor


def get_full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as a full (unsharded) tensor on every rank."""
    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value.detach().clone())
        for name, value in module.state_dict().items()
    }


def load_full_state_dict(module: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Load full tensors into a fully_shard module: each rank keeps only its own shard."""
    current = module.state_dict()
    missing = sorted(set(current) - set(full))
    unexpected = sorted(set(full) - set(current))
    if missing or unexpected:
        raise ValueError(f"full state dict does not match the module: missing {missing}, unexpected {unexpected}")
    sharded = {}
    for name, value in current.items():
        source = full[name]
        if tuple(source.shape) != tuple(value.shape):
            raise ValueError(
                f"{name}: full tensor has shape {tuple(source.shape)}, the module expects {tuple(value.shape)}"
            )
        if isinstance(value, DTensor):
            sharded[name] = distribute_tensor(
                source.to(value.dtype), value.device_mesh, value.placements, src_data_rank=None
            )
        else:
            sharded[name] = source
    module.load_state_dict(sharded)
