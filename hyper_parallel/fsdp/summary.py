"""What each fully_shard unit of a model holds and how it communicates: for figures and cost checks."""

from __future__ import annotations

import torch.nn as nn


def describe_units(root: nn.Module) -> list[dict]:
    """One dict per fully_shard unit under ``root`` (outermost last, as units are applied bottom-up).

    ``model_local_bytes``: bytes of the unit's parameters as each rank computes with them (after TP/EP);
    ``padded_bytes``: the flat all-gather buffer (model-parallel local bytes padded to a multiple of shard_size);
    ``sharded_group`` / ``unsharded_group``: name and global ranks of the RS and AR groups.
    """
    units, seen = [], set()
    for name, module in root.named_modules():
        state = getattr(module, "_hp_state", None)
        if state is None or id(state) in seen:
            continue
        seen.add(id(state))
        for group in state.groups:
            units.append(_describe_group(name or "root", state, group))
    return sorted(units, key=lambda unit: unit["unit"] == "root")


def _describe_group(unit: str, state, group) -> dict:
    first = group.params[0]  # every parameter of a group holds the unit's sizes and groups
    element = first.sharded_param.element_size()
    return {
        "unit": unit,
        "params": [p.fqn for p in group.params],
        "model_local_bytes": sum(_numel(p.model_local_shape) for p in group.params) * element,
        "padded_bytes": group.total * group.shard_size * element,
        "global_bytes": sum(_numel(p.global_shape) for p in group.params) * element,
        "shard_size": group.shard_size,
        "dp_size": first.dp_size,
        "rank_size": first.rank_size,
        "sharded_group": {"name": group.sharded_group.name, "ranks": list(group.sharded_group.ranks)},
        "unsharded_group": {"name": first.unsharded_group_info.name, "ranks": list(first.unsharded_group_info.ranks)},
        "reshard_after_forward": state.reshards_after_forward,
        "dtype": str(group.orig_dtype).removeprefix("torch."),
    }


def _numel(shape) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def gathered_bytes(root: nn.Module) -> int:
    """Bytes of all-gathered parameters the fully_shard units under ``root`` hold on this rank right now
    (units that shard, in their compute dtype): what resharding them would free."""
    total, seen = 0, set()
    for module in root.modules():
        state = getattr(module, "_hp_state", None)
        if state is None or id(state) in seen:
            continue
        seen.add(id(state))
        total += sum(
            group.shard_size * group.total * group.param_dtype.itemsize
            for group in state.groups
            if group.needs_all_gather and group.is_unsharded
        )
    return total
