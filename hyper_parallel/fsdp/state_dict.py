"""State dicts of fully_shard modules.

The sharded state dict is simply ``module.state_dict()``: every managed parameter is its sharded DTensor
then, since saving or loading a state dict first reshards the unit (a hook on every module holding one of
its parameters, as FSDP2 registers them), also after a forward that kept the parameters unsharded
(``reshard_after_forward=False``, the root); ``module.load_state_dict`` copies DTensors of the same layout
in place (into the flat shard buffer). The full state dict gathers every parameter (``full_tensor()``, a
collective: call it on every rank; torch's ``get_model_state_dict(..., options=StateDictOptions(full_state_dict=True))``
does it), and loading one cuts each full tensor back to this rank's piece (``distribute_tensor``, or torch's
``set_model_state_dict``).
"""

from __future__ import annotations

import torch.nn as nn


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
