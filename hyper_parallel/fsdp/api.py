"""``fully_shard``: torch FSDP2's API extended to multi-dimensional meshes.

    fully_shard(module | [modules], *, mesh=None, reshard_after_forward=None,
                mp_policy=MixedPrecisionPolicy(), ignored_params=None, dp_mesh_dims=None,
                enable_param_shard=None) -> module

Apply bottom-up (each block, then the root). Every parameter of ``module`` not already managed by a
nested ``fully_shard`` becomes one DTensor on the combined mesh (the data-parallel dims of ``mesh`` +
the model-parallel dims the parameter already had from TP/EP) and exposes its ``GroupInfo``s.

A parameter registered on several modules of the unit (tied embeddings) is managed once: one
sharded DTensor set on every module that holds it, whose gradient sums all its uses. Shared between
two units it is refused, since each unit would reduce its own copy of the gradient.

Parameters built on the meta device stay meta shards until ``to_empty`` (then initialise them, or load a
state dict). A unit's parameters of different dtypes (a frozen bf16 base beside trainable fp32
adapters) are gathered in one flat buffer per dtype.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from hyper_parallel.fsdp.layouts import MANAGED_BY_ATTR, SHARDED_BY_ATTR, layout_of, requested_axis, unmanaged_params
from hyper_parallel.fsdp.module import FullyShardModule
from hyper_parallel.fsdp.param import ShardedParam
from hyper_parallel.fsdp.param_group import MixedPrecisionPolicy, ParamGroup
from hyper_parallel.fsdp.state import FullyShardState
from hyper_parallel.fsdp.state_dict import register_resharding_state_dict_hooks
from hyper_parallel.fsdp.torch_interop import TorchStateView, register_with_torch
from hyper_parallel.fsdp.unit_mesh import UnitMesh

_WRAPPER_CLASSES: dict[type, type] = {}
"""One ``FSDP<Class>`` per user class, named and cached as torch FSDP2 names and caches its own."""


def fully_shard(
    module: nn.Module | list[nn.Module],
    *,
    mesh: DeviceMesh | None = None,
    reshard_after_forward: bool | None = None,
    mp_policy: MixedPrecisionPolicy = MixedPrecisionPolicy(),
    ignored_params: set[nn.Parameter] | None = None,
    dp_mesh_dims=None,
    enable_param_shard: bool | None = None,
    shard_placement_fn=None,
    offload_policy=None,
):
    """Shard ``module``'s parameters over the data-parallel dims of ``mesh`` (see module docstring).

    ``module`` may be a list: one unit (one all-gather, one reduce-scatter) for several modules.
    ``reshard_after_forward``: None reshards every unit but the root (FSDP2's default), True/False all.
    ``ignored_params`` stay as they are: not sharded, not moved, their gradients not reduced.
    ``dp_mesh_dims`` (``torch.distributed.fsdp.DataParallelMeshDims``) names the data-parallel dims of a
    full mesh whose parameters are already DTensors on it; without it roles follow the dims' names.
    """
    modules = _validated_modules(module)
    _refuse_unsupported(offload_policy)
    unit_mesh = UnitMesh.resolve(mesh, enable_param_shard, dp_mesh_dims, reshard_after_forward)
    prefix = type(modules[0]).__name__
    managed = _sharded_params(modules, unit_mesh, ignored_params, shard_placement_fn, prefix)
    by_kind: dict[tuple[torch.dtype, bool], list[ShardedParam]] = {}
    for param in managed:  # one flat buffer per dtype (and meta or not): what one all-gather can carry
        by_kind.setdefault((param.orig_dtype, param.is_meta), []).append(param)
    groups = [ParamGroup(prefix, members, mp_policy, unit_mesh) for members in by_kind.values()]
    for param in managed:
        _expose(param, prefix)
    state = FullyShardState(modules, groups, unit_mesh.reshard_after_forward, mp_policy)
    view = TorchStateView(state)
    for each in modules:
        each.__class__ = _wrapper_class(each.__class__)
        each._hp_state = state
        register_with_torch(each, view)
    register_resharding_state_dict_hooks(state, [owner for p in managed for owner, _ in p.owners] + modules)
    return module


class AppliedTwiceError(ValueError, AssertionError):
    """fully_shard applied to a module it already manages: an ``AssertionError``, as torch FSDP2 raises it, and a
    ``ValueError``, as the rest of this API's refusals."""


def _state(module: nn.Module) -> TorchStateView:
    """``fully_shard.state(module)``, as torch's: the view of the unit's state that torch's FSDP2 helpers read."""
    return module._get_fsdp_state()


fully_shard.state = _state


def _sharded_params(
    modules: list[nn.Module], unit_mesh: UnitMesh, ignored_params, shard_placement_fn, prefix: str
) -> list[ShardedParam]:
    """Every floating-point parameter of ``modules`` no nested unit manages, as a ``ShardedParam`` of this unit
    (moved to the mesh's device first, sharded on the tensor dim ``shard_placement_fn`` asks for)."""
    ignored = {id(p) for p in (ignored_params or ())}
    managed = []
    for fqn, owners, param in unmanaged_params(modules, ignored):
        original = param
        if param.device != unit_mesh.device and param.device.type != "meta":
            param = _moved(param, unit_mesh.device)
        layout = layout_of(unit_mesh.mesh, unit_mesh.roles, param, fqn)
        if shard_placement_fn is not None:
            axis = requested_axis(shard_placement_fn(original), original, fqn, unit_mesh.mesh)
            layout = replace(layout, fsdp_axis=axis)
        managed.append(ShardedParam(fqn, owners, param, unit_mesh, layout))
        setattr(original, MANAGED_BY_ATTR, f"{fqn} of the fully_shard unit {prefix}")
    if any(not p.orig_dtype.is_floating_point for p in managed):
        raise ValueError(
            f"fully_shard manages floating-point parameters only; {prefix} has "
            f"{sorted({str(p.orig_dtype) for p in managed})}: pass the others as ignored_params"
        )
    return managed


def _expose(param: ShardedParam, prefix: str) -> None:
    """What the sharded parameter the module holds shows of its unit: its ``GroupInfo``s and their sizes."""
    exposed = param.sharded_param
    exposed.sharded_group_info, exposed.unsharded_group_info = param.sharded_group_info, param.unsharded_group_info
    exposed.shard_size, exposed.dp_size, exposed.rank_size = param.shard_size, param.dp_size, param.rank_size
    setattr(exposed, SHARDED_BY_ATTR, prefix)


def _validated_modules(module) -> list[nn.Module]:
    modules = list(module) if isinstance(module, (list, tuple)) else [module]
    if not modules:
        raise ValueError("fully_shard got an empty list of modules")
    for each in modules:
        if not isinstance(each, nn.Module):
            raise ValueError(f"fully_shard expects an nn.Module or a list of them, got {type(each).__name__}")
        if isinstance(each, (nn.ModuleList, nn.ModuleDict)) and type(each).forward is nn.Module.forward:
            raise ValueError(
                f"fully_shard does not support containers that do not implement forward: {type(each).__name__} "
                "(as torch FSDP2): apply it to each module in the container, or to several as one unit with "
                "fully_shard(list(container))"
            )
        if isinstance(each, FullyShardModule):
            raise AppliedTwiceError(
                "Each distinct composable distributed API can only be applied to a module once (torch FSDP2's "
                f"rule): fully_shard has already been applied to this {type(each).__name__}; apply it once per module"
            )
    return modules


def _refuse_unsupported(offload_policy) -> None:
    """FSDP2 arguments this implementation does not offer: refused by name, never silently ignored."""
    if offload_policy is not None and type(offload_policy).__name__ != "OffloadPolicy":
        raise NotImplementedError(
            f"offload_policy={type(offload_policy).__name__} (CPU offload) is not supported "
            "by hyper_parallel's fully_shard"
        )


def _wrapper_class(cls: type) -> type:
    """``FSDP<cls>``: ours first in the MRO (as FSDP2), created once per user class."""
    if cls not in _WRAPPER_CLASSES:
        _WRAPPER_CLASSES[cls] = type(f"FSDP{cls.__name__}", (FullyShardModule, cls), {})
    return _WRAPPER_CLASSES[cls]


def _moved(param: nn.Parameter, device: torch.device) -> nn.Parameter:
    return nn.Parameter(param.detach().to(device), requires_grad=param.requires_grad)
