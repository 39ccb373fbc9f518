"""State dicts of fully_shard modules.

The sharded state dict is simply ``module.state_dict()``: every managed parameter is its sharded DTensor
then, since saving or loading a state dict first reshards the unit (a hook on every module holding one of
its parameters, as FSDP2 registers them), also after a forward that kept the parameters unsharded
(``reshard_after_forward=False``, the root); ``module.load_state_dict`` copies DTensors of the same layout
in place (into the flat shard buffer). The full state dict gathers every parameter (``full_tensor()``, a
collective: call it on every rank); loading one cuts each full tensor back to this rank's piece.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor


def register_resharding_state_dict_hooks(state, modules: list[nn.Module]) -> None:
    """``state_dict()`` / ``load_state_dict()`` on any of ``modules`` (a unit's modules and every module holding
    one of its parameters) reshards the unit first, so they read and write the sharded DTensors, never the
    unsharded compute parameters a forward left in place; the next forward or backward gathers again."""

    def reshard(*_args, **_kwargs) -> None:
        state.reshard()

    seen: set[int] = set()
    for module in modules:
        if id(module) in seen:
            continue
        seen.add(id(module))
        module.register_state_dict_pre_hook(reshard)
        module.register_load_state_dict_pre_hook(reshard)


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
