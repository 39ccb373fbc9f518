"""``fully_shard``: torch FSDP2's API extended to multi-dimensional meshes (the RFC).

    fully_shard(module, *, mesh=None, reshard_after_forward=True,
                mp_policy=MixedPrecisionPolicy(), enable_param_shard=None) -> module

Apply bottom-up (each block, then the root). Every parameter of ``module`` not already managed by a
nested ``fully_shard`` becomes one DTensor on the combined mesh (the data-parallel dims of ``mesh`` +
the model-parallel dims the parameter already had from TP/EP) and exposes its ``GroupInfo``s.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

from hyper_parallel import comm
from hyper_parallel.comm import GroupInfo
from hyper_parallel.fsdp.param import ParamLayout, ShardedParam
from hyper_parallel.fsdp.param_group import MixedPrecisionPolicy, ParamGroup
from hyper_parallel.fsdp.roles import MeshRoles, resolve_roles
from hyper_parallel.fsdp.state import FullyShardState


class FullyShardModule:
    """Methods added to a module by ``fully_shard`` (it becomes a subclass of its own class and this)."""

    _hp_state: FullyShardState

    def _states(self, recurse: bool) -> list[FullyShardState]:
        if not recurse:
            return [self._hp_state]
        return [m._hp_state for m in self.modules() if isinstance(m, FullyShardModule)]

    def unshard(self) -> None:
        """All-gather this unit's parameters now (only the FSDP dim; TP/EP placements stay)."""
        self._hp_state.unshard()

    def reshard(self) -> None:
        """Free the unsharded parameters; the module holds its sharded DTensors again."""
        self._hp_state.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """False: skip reduce-scatter and all-reduce, accumulate unsharded gradients locally (gradient
        accumulation); the next backward with True reduces the accumulated sum."""
        for state in self._states(recurse):
            if state.group is not None:
                state.group.requires_gradient_sync = bool(requires_gradient_sync)

    def set_requires_all_reduce(self, requires_all_reduce: bool, *, recurse: bool = True) -> None:
        """False (HSDP): reduce-scatter but keep the result partial over the replicate group; the next
        backward with True all-reduces the sum."""
        for state in self._states(recurse):
            if state.group is not None:
                state.group.requires_all_reduce = bool(requires_all_reduce)

    def set_reshard_after_forward(self, reshard_after_forward: bool, *, recurse: bool = True) -> None:
        for state in self._states(recurse):
            state.reshard_after_forward = bool(reshard_after_forward)

    def set_gradient_divide_factor(self, factor: float, *, recurse: bool = True) -> None:
        """Divide reduced gradients by ``factor`` instead of the data-parallel world (rank_size)."""
        if factor <= 0:
            raise ValueError(f"gradient divide factor must be > 0, got {factor}")
        for state in self._states(recurse):
            if state.group is not None:
                state.group.gradient_divide_factor = float(factor)

    def set_modules_to_forward_prefetch(self, modules: list[nn.Module]) -> None:
        """All-gather these units' parameters at the start of this unit's forward."""
        self._hp_state.forward_prefetch = [_state_of(m) for m in modules]

    def set_modules_to_backward_prefetch(self, modules: list[nn.Module]) -> None:
        """All-gather these units' parameters when backward reaches this unit."""
        self._hp_state.backward_prefetch = [_state_of(m) for m in modules]

    def sharded_params(self) -> list[ShardedParam]:
        """This unit's managed parameters (not those of nested fully_shard units)."""
        group = self._hp_state.group
        return list(group.params) if group is not None else []

    def sync_weights(self) -> None:
        """Compat mode (RFC 2.2.4): make every replica's weights equal, on explicit request only.

        Broadcasts each unit's sharded parameters from the first rank of the unsharded dp group, and
        parameters with partial gradients from the first rank of their model-parallel group."""
        for state in self._states(recurse=True):
            group = state.group
            if group is None:
                continue
            with torch.no_grad():
                comm.broadcast(group.flat_shard, group.unsharded_group, module=group.name)
                for param in group.params:
                    for mp_group in param.partial_groups():
                        comm.broadcast(param.sharded_param.to_local(), mp_group, module=group.name)


def _state_of(module: nn.Module) -> FullyShardState:
    if not isinstance(module, FullyShardModule):
        raise ValueError(f"{type(module).__name__} is not managed by fully_shard; apply fully_shard to it first")
    return module._hp_state


def _default_mesh() -> DeviceMesh:
    if not dist.is_initialized():
        raise RuntimeError("fully_shard needs torch.distributed initialised (init_process_group) first")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return init_device_mesh(device, (dist.get_world_size(),), mesh_dim_names=("fsdp",))


def _layout(mesh: DeviceMesh, roles: MeshRoles, param: nn.Parameter, fqn: str) -> ParamLayout:
    """The parameter's single mesh: the data-parallel dims of ``mesh`` + its own model-parallel dims.

    Model-parallel dims named in ``mesh`` but not in the parameter's DTensor are Replicate; a plain
    parameter keeps computing as a plain tensor, a DTensor one on its own mesh and placements.
    """
    names = tuple(mesh.mesh_dim_names)
    if not isinstance(param, DTensor):
        mp_dims = roles.model_parallel_dims
        return ParamLayout(mesh, mp_dims, tuple(Replicate() for _ in mp_dims), None, ())
    own_mesh, own_placements = param.device_mesh, tuple(param.placements)
    own_names = tuple(own_mesh.mesh_dim_names or ())
    data_dims = tuple(d for d in names if d not in roles.model_parallel_dims)
    clash = set(own_names) & set(data_dims)
    if clash:
        raise ValueError(f"parameter {fqn!r} is already a DTensor over {sorted(clash)}, which fully_shard's mesh "
                         "uses as a data-parallel dim; apply TP/EP on model-parallel dims (tp, ep, etp) only")
    if mesh._get_root_mesh() != own_mesh._get_root_mesh():
        raise ValueError(
            f"the fully_shard mesh {names} and the mesh {own_names} of parameter {fqn!r} do not share a root "
            "mesh; build both from one mesh (e.g. ParallelDims.build_mesh views, or slices of one init_device_mesh)")
    if set(own_names) <= set(roles.model_parallel_dims):
        mp_dims = roles.model_parallel_dims
        placements = tuple(own_placements[own_names.index(d)] if d in own_names else Replicate() for d in mp_dims)
        return ParamLayout(mesh, mp_dims, placements, own_mesh, own_placements)
    combined = DeviceMesh._concatenate([mesh[data_dims], own_mesh]) if data_dims else own_mesh
    return ParamLayout(combined, own_names, own_placements, own_mesh, own_placements)


def fully_shard(module: nn.Module, *, mesh: DeviceMesh | None = None, reshard_after_forward: bool = True,
                mp_policy: MixedPrecisionPolicy = MixedPrecisionPolicy(),
                enable_param_shard: bool | None = None) -> nn.Module:
    """Shard ``module``'s parameters over the data-parallel dims of ``mesh`` (see module docstring)."""
    if isinstance(module, FullyShardModule):
        raise ValueError(f"fully_shard was already applied to this {type(module).__name__}; apply it once per module")
    if not isinstance(module, nn.Module):
        raise ValueError(f"fully_shard expects an nn.Module, got {type(module).__name__}")
    mesh = mesh if mesh is not None else _default_mesh()
    roles = resolve_roles(mesh, enable_param_shard)
    device = torch.device(mesh.device_type, torch.cuda.current_device()) if mesh.device_type == "cuda" \
        else torch.device(mesh.device_type)
    sharded_group = GroupInfo.from_mesh(mesh, (roles.shard_dim,) if roles.shard_dim else ())
    unsharded_group = GroupInfo.from_mesh(mesh, roles.replicate_dims)
    params = _unmanaged_params(module)
    prefix = type(module).__name__
    managed = []
    groups: dict[tuple[str, tuple[int, ...]], GroupInfo] = {}
    for fqn, owner, leaf, param in params:
        if param.device != device and param.device.type != "meta":
            param = _moved(param, device)
        layout = _layout(mesh, roles, param, fqn)
        mp_groups = {}
        for dim in layout.mp_dims:
            ranks = tuple(int(r) for r in layout.combined[dim].mesh.flatten().tolist())
            if (dim, ranks) not in groups:
                groups[(dim, ranks)] = GroupInfo.from_mesh(layout.combined, (dim,))
            mp_groups[dim] = groups[(dim, ranks)]
        managed.append(ShardedParam(fqn, owner, leaf, param, roles, sharded_group, unsharded_group, layout, mp_groups))
    dtypes = {p.orig_dtype for p in managed}
    if len(dtypes) > 1:
        raise ValueError(f"parameters of one fully_shard unit are gathered and reduced in one flat buffer and "
                         f"must share a dtype; {prefix} has {sorted(str(d) for d in dtypes)}: cast the module "
                         "to one dtype (use MixedPrecisionPolicy for low-precision compute) or apply fully_shard "
                         "to the submodules separately")
    if any(not d.is_floating_point for d in dtypes):
        raise ValueError(f"fully_shard manages floating-point parameters only; {prefix} has {dtypes}")
    group = ParamGroup(prefix, managed, mp_policy, device) if managed else None
    if group is not None:
        for param in managed:
            exposed = param.sharded_param
            exposed.sharded_group_info = param.sharded_group_info
            exposed.unsharded_group_info = param.unsharded_group_info
            exposed.shard_size, exposed.dp_size, exposed.rank_size = param.shard_size, param.dp_size, param.rank_size
    state = FullyShardState(module, group, reshard_after_forward, mp_policy)
    module.register_state_dict_post_hook(_detach_from_flat_buffer)
    cls = module.__class__
    module.__class__ = type(f"FullyShard{cls.__name__}", (cls, FullyShardModule), {})
    module._hp_state = state
    return module


def _detach_from_flat_buffer(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    """Give each sharded tensor of the state dict its own storage.

    A unit's shards are views into one flat buffer (the all-gather input); torch.save cannot pickle a
    DTensor whose local tensor is a view at a non-zero offset, and a checkpoint should not pin the
    whole buffer either. The clone costs one copy of this rank's shards, only when a state dict is taken.
    """
    for key, value in state_dict.items():
        if key.startswith(prefix) and isinstance(value, DTensor) and value.to_local().storage_offset() != 0:
            local = value.to_local().detach().clone()
            state_dict[key] = DTensor.from_local(local, value.device_mesh, value.placements, run_check=False,
                                                 shape=value.shape, stride=value.stride())


def _moved(param: nn.Parameter, device: torch.device) -> nn.Parameter:
    return nn.Parameter(param.detach().to(device), requires_grad=param.requires_grad)


def _unmanaged_params(module: nn.Module) -> list[tuple[str, nn.Module, str, nn.Parameter]]:
    """(fqn, owning module, attribute name, parameter) for parameters not inside a nested fully_shard unit."""
    result = []
    seen: set[int] = set()

    def visit(mod: nn.Module, prefix: str) -> None:
        for name, param in mod._parameters.items():
            if param is None or id(param) in seen:
                continue
            seen.add(id(param))
            result.append((f"{prefix}{name}", mod, name, param))
        for child_name, child in mod._modules.items():
            if child is None or isinstance(child, FullyShardModule):
                continue
            visit(child, f"{prefix}{child_name}.")

    visit(module, "")
    return result
