"""Where each parameter of a new fully_shard unit goes: which parameters the unit manages, and the one
layout on the combined mesh each of them gets (as torch FSDP2's ``_fsdp_init``).

Meshes are matched by the ranks they group, never by object identity or DeviceMesh's caches: any
slices of one ``init_device_mesh`` (or of ParallelDims views) combine, in any order of creation.
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from hyper_parallel.fsdp.module import FullyShardModule
from hyper_parallel.fsdp.param import ParamLayout
from hyper_parallel.fsdp.roles import MeshRoles
from hyper_parallel.mesh_slices import sub_mesh

SHARDED_BY_ATTR = "_hp_sharded_by"
"""Set on the sharded DTensor parameter a unit registers: applying fully_shard to a module inside an
already sharded one (top-down) finds it and says to go bottom-up."""
MANAGED_BY_ATTR = "_hp_managed_by"
"""Set on a user's original parameter once a unit manages it: the unit's module, for the error when a
second unit finds the same parameter (shared across units)."""


def layout_of(mesh: DeviceMesh, roles: MeshRoles, param: nn.Parameter, fqn: str) -> ParamLayout:
    """The parameter's single mesh: the data-parallel dims of ``mesh`` + its own model-parallel dims.

    Model-parallel dims named in ``mesh`` but not in the parameter's DTensor are Replicate; a plain
    parameter keeps computing as a plain tensor, a DTensor one on its own mesh and placements.
    """
    names = tuple(mesh.mesh_dim_names)
    if not isinstance(param, DTensor):
        model_dims = roles.model_parallel_dims
        return ParamLayout(mesh, model_dims, tuple(Replicate() for _ in model_dims), None, ())
    own_mesh, own_placements = param.device_mesh, tuple(param.placements)
    own_names = tuple(own_mesh.mesh_dim_names or ())
    data_dims = tuple(d for d in names if d not in roles.model_parallel_dims)
    if own_names == names and _same_ranks(own_mesh, mesh):
        return _spmd_layout(mesh, roles, own_mesh, own_placements, fqn)
    clash = set(own_names) & set(data_dims)
    if clash:
        raise ValueError(
            f"parameter {fqn!r} is already a DTensor over {sorted(clash)}, which fully_shard's mesh "
            "uses as a data-parallel dim; apply TP/EP on model-parallel dims (tp, ep, etp) only, or "
            "pass the full mesh with dp_mesh_dims=DataParallelMeshDims(shard=..., replicate=...)"
        )
    if set(own_names) <= set(roles.model_parallel_dims):
        if not _same_ranks(own_mesh, sub_mesh(mesh, own_names)):
            raise ValueError(
                f"parameter {fqn!r} is a DTensor over {own_names} with ranks "
                f"{own_mesh.mesh.tolist()}, but fully_shard's mesh groups ranks "
                f"{mesh[own_names].mesh.tolist()} over those dims: slice both from one mesh"
            )
        model_dims = roles.model_parallel_dims
        placements = tuple(own_placements[own_names.index(d)] if d in own_names else Replicate() for d in model_dims)
        return ParamLayout(mesh, model_dims, placements, own_mesh, own_placements)
    if not data_dims:
        return ParamLayout(own_mesh, own_names, own_placements, own_mesh, own_placements)
    try:
        combined = DeviceMesh._concatenate([sub_mesh(mesh, data_dims), own_mesh])
    except RuntimeError as error:
        raise ValueError(
            f"the fully_shard mesh {names} and the mesh {own_names} of parameter {fqn!r} cannot be combined into "
            f"one mesh ({error}); build both as slices of one init_device_mesh (or ParallelDims views), with "
            "the data-parallel and model-parallel dims on separate axes"
        ) from None
    return ParamLayout(combined, own_names, own_placements, own_mesh, own_placements)


def requested_axis(result, param: nn.Parameter, fqn: str, mesh: DeviceMesh) -> int | None:
    """The tensor dim FSDP2's ``shard_placement_fn`` returned for ``param`` (``Shard(d)``, a negative d counted
    from the end, or a ``ShardPlacementResult`` on fully_shard's own mesh); None keeps fully_shard's choice."""
    if type(result).__name__ == "ShardPlacementResult":
        other = getattr(result.mesh_info, "mesh", None)
        if other is not None and not (_same_ranks(other, mesh) and other.ndim == mesh.ndim):
            raise NotImplementedError(
                f"shard_placement_fn put {fqn!r} on another mesh ({other}) than fully_shard's ({mesh}); "
                "per-parameter meshes in one unit are not supported: apply fully_shard to those parameters' "
                "module on that mesh (e.g. the experts on their efsdp mesh)"
            )
        result = result.placement
    if result is None:
        return None
    if type(result) is not Shard:
        raise ValueError(f"shard_placement_fn must return Shard(dim) or None for {fqn!r}, got {result!r}")
    ndim = param.dim()
    if not -ndim <= result.dim < ndim:
        raise InvalidShardDimError(
            f"Shard dim {result.dim} is invalid for {ndim}D tensor: shard_placement_fn returned {result!r} for "
            f"{fqn!r}; return a dim in [-{ndim}, {ndim}) or None (fully_shard's choice)"
        )
    return result.dim % ndim


class InvalidShardDimError(ValueError, AssertionError):
    """``shard_placement_fn`` named a dim the parameter lacks: a ``ValueError``, as this API's refusals, and an
    ``AssertionError`` with FSDP2's words, as torch FSDP2 raises it."""


def _same_ranks(a: DeviceMesh, b: DeviceMesh) -> bool:
    """The same ranks in the same arrangement (this rank's sub-mesh of each)."""
    return a.mesh.shape == b.mesh.shape and bool((a.mesh == b.mesh).all())


def _spmd_layout(
    mesh: DeviceMesh, roles: MeshRoles, own_mesh: DeviceMesh, own_placements: tuple, fqn: str
) -> ParamLayout:
    """A parameter already a DTensor on fully_shard's whole mesh (FSDP2's ``dp_mesh_dims`` mode): it must be
    Replicate on the data-parallel dims; its other dims are model-parallel."""
    names = tuple(mesh.mesh_dim_names)
    data = set(roles.replicate_dims) | ({roles.shard_dim} if roles.shard_dim else set())
    wrong = [d for d, p in zip(names, own_placements) if d in data and not isinstance(p, Replicate)]
    if wrong:
        raise ValueError(
            f"Expected Replicate on the data-parallel dim(s) {wrong}: parameter {fqn!r} is a DTensor on the "
            "whole mesh sharded over them; distribute it Replicate there, fully_shard shards those itself"
        )
    model_dims = roles.model_parallel_dims
    placements = tuple(own_placements[names.index(d)] for d in model_dims)
    return ParamLayout(mesh, model_dims, placements, own_mesh, own_placements)


def unmanaged_params(
    modules: list[nn.Module], ignored: set[int]
) -> list[tuple[str, list[tuple[nn.Module, str]], nn.Parameter]]:
    """(fqn, every (module, attribute) holding it, parameter) for the parameters of ``modules`` that no
    nested fully_shard unit manages. A parameter held by several modules (tied weights) appears once,
    with all its owners; one already managed by another unit is an error naming both places."""
    found: dict[int, tuple[str, list[tuple[nn.Module, str]], nn.Parameter]] = {}
    several = len(modules) > 1

    def visit(mod: nn.Module, prefix: str) -> None:
        for name, param in mod._parameters.items():
            if param is None or id(param) in ignored:
                continue
            if id(param) in found:
                found[id(param)][1].append((mod, name))
                continue
            owner_unit = getattr(param, SHARDED_BY_ATTR, None)
            if owner_unit is not None:
                raise ValueError(
                    f"parameter {prefix}{name} is already sharded by the fully_shard unit {owner_unit}, which "
                    "encloses this module: apply fully_shard bottom-up (each block first, then the root)"
                )
            elsewhere = getattr(param, MANAGED_BY_ATTR, None)
            if elsewhere is not None:
                raise ValueError(
                    f"parameter {prefix}{name} is already managed by another fully_shard unit (FSDP2's words; "
                    f"{elsewhere}): a parameter held by two fully_shard units would have its gradient reduced twice. Apply fully_shard so that one unit holds "
                    "every module using it (e.g. leave both in the root, or fully_shard([module_a, module_b]))"
                )
            found[id(param)] = (f"{prefix}{name}", [(mod, name)], param)
        for child_name, child in mod._modules.items():
            if child is None or isinstance(child, FullyShardModule):
                continue
            visit(child, f"{prefix}{child_name}.")

    for index, mod in enumerate(modules):
        visit(mod, f"{index}." if several else "")
    return list(found.values())
