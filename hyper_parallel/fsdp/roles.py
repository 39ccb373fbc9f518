"""Which dims of the mesh given to ``fully_shard`` replicate, shard, or belong to model parallelism.

Rules:
* ``tp``, ``ep``, ``etp`` are model-parallel: their placements come from the parameters' own DTensors.
* ``dp_replicate`` always replicates.
* every other dim is data-parallel. Of two data-parallel dims the outer replicates and the inner
  shards (HSDP, as torch FSDP2 reads a 2-D mesh); a single one shards, so a 1-D ``mesh["dp"]``
  written for torch FSDP2 keeps its meaning. Three or more are ambiguous and rejected.
* ``enable_param_shard``: True shards over the shard dim (error if none), False turns the shard dim
  into a replica dim (shard_size = 1), None shards iff a shard dim of size > 1 exists (docs/fully_shard.md).
* ``dp_mesh_dims`` (torch FSDP2's ``DataParallelMeshDims``) names the shard and replicate dims
  explicitly; every other dim of the mesh is then model-parallel, whatever its name.
* a mesh without dim names (``init_device_mesh("cpu", (4,))``, as FSDP2's docs write it) is read by
  position, as FSDP2 reads it: 1-D shards, 2-D replicates over dim 0 and shards over dim 1
  (``named_mesh``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh

from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_slices import sub_mesh

MODEL_PARALLEL_DIMS = (MeshDim.TP, MeshDim.EP, MeshDim.ETP)
REPLICATE_DIM = MeshDim.DP_REPLICATE


@dataclass(frozen=True)
class MeshRoles:
    """Role of each dim of one fully_shard mesh."""

    mesh: DeviceMesh
    replicate_dims: tuple[str, ...]  # all-reduce dims (the unsharded group)
    shard_dim: str | None  # reduce-scatter dim (the sharded group), None when not sharding
    model_parallel_dims: tuple[str, ...]

    @property
    def data_parallel_dims(self) -> tuple[str, ...]:
        """Dims over which data differs, in mesh order: gradients are averaged over them."""
        dp = set(self.replicate_dims) | ({self.shard_dim} if self.shard_dim else set())
        return tuple(d for d in self.mesh.mesh_dim_names if d in dp)

    def size(self, dims: tuple[str, ...]) -> int:
        result = 1
        for dim in dims:
            result *= self.mesh.size(self.mesh.mesh_dim_names.index(dim))
        return result

    @property
    def rank_size(self) -> int:
        """Size of the data-parallel domain: shard_size * dp_size."""
        return self.size(self.data_parallel_dims)

    @property
    def shard_size(self) -> int:
        return self.size((self.shard_dim,)) if self.shard_dim else 1

    @property
    def dp_size(self) -> int:
        return self.rank_size // self.shard_size


POSITIONAL_NAMES = {1: (MeshDim.FSDP,), 2: (REPLICATE_DIM, MeshDim.FSDP)}
"""The names an unnamed mesh's dims get, by its number of dims: FSDP2's reading of a 1-D and a 2-D mesh."""


def named_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """``mesh`` itself when its dims have names; otherwise the same mesh with the names FSDP2's positional
    reading gives them (``POSITIONAL_NAMES``), on a view that shares its process groups (no new groups),
    since roles, placements and groups are resolved by dim name here."""
    if mesh.mesh_dim_names is not None:
        return mesh
    if mesh.ndim not in POSITIONAL_NAMES:
        raise ValueError(
            f"fully_shard expects a 1D or 2D DeviceMesh but got {mesh} ({mesh.ndim}-D, without dim names): FSDP2 "
            "reads only a 1-D (shard) or 2-D (replicate, shard) mesh by position; name the dims, e.g. "
            "init_device_mesh(..., mesh_dim_names=('dp_replicate', 'fsdp', 'tp'))"
        )
    view = DeviceMesh(
        mesh.device_type,
        mesh_dim_names=POSITIONAL_NAMES[mesh.ndim],
        _layout=mesh._layout,
        _rank_map=mesh._rank_map,
        _root_mesh=mesh._get_root_mesh(),
        _init_backend=False,
    )
    view._dim_group_names = list(mesh._dim_group_names)
    return view


def without_size_one_dims(mesh: DeviceMesh, data_parallel_dims: tuple[str, ...]) -> DeviceMesh:
    """The mesh a parameter's DTensor is built on: ``mesh`` without its dims of size 1, as torchtitan builds
    its meshes (a ``(1, n)`` HSDP mesh is FSDP on ``n``); when every dim is 1, the innermost data-parallel dim.

    A size-1 dim changes nothing a DTensor computes, but DTensor's sharding propagation enumerates every
    combination of per-dim strategies over all dims, so each size-1 dim multiplies the cost of the first
    (uncached) call of every op by ~8-10 (one SGD ``add_`` on a (1, 1, 2, 2) expert weight: 5.7 s; on (2, 2):
    0.13 s). Roles, groups, traces and figures keep the named mesh."""
    names = tuple(mesh.mesh_dim_names)
    kept = tuple(name for name, size in zip(names, mesh.shape) if size > 1)
    if not kept:
        kept = (data_parallel_dims or names)[-1:]
    return mesh if kept == names else sub_mesh(mesh, kept)


def _explicit_roles(mesh: DeviceMesh, names: tuple[str, ...], dp_mesh_dims, enable_param_shard) -> MeshRoles:
    """torch FSDP2's ``DataParallelMeshDims``: the data-parallel dims named, every other dim model-parallel."""
    shard, replicate = tuple(dp_mesh_dims.shard_names), tuple(dp_mesh_dims.replicate_names)
    for label, dims in (("shard", shard), ("replicate", replicate)):
        unknown = [d for d in dims if d not in names]
        if unknown:  # FSDP2's words first (torch's suite matches them), then the fix
            raise ValueError(
                f"Mesh dim name {unknown[0]!r} not found in mesh.mesh_dim_names {names}: dp_mesh_dims.{label} "
                f"names {unknown}; name dims the mesh has"
            )
    if len(shard) > 1 or len(replicate) > 1:
        raise ValueError(
            f"dp_mesh_dims with several {'shard' if len(shard) > 1 else 'replicate'} dims "
            f"({shard or replicate}) is not supported: flatten them into one mesh dim first "
            "(mesh[names]._flatten(name), or the 'fsdp' view of ParallelDims)"
        )
    if set(shard) & set(replicate):
        raise ValueError(f"dp_mesh_dims names {sorted(set(shard) & set(replicate))} as both shard and replicate")
    shard_dim = shard[0] if shard else None
    replicate_dims = list(replicate)
    if enable_param_shard is True and shard_dim is None:
        raise ValueError("enable_param_shard=True but dp_mesh_dims names no shard dim")
    if shard_dim is not None and enable_param_shard is False:
        replicate_dims.append(shard_dim)
        shard_dim = None
    model_parallel = tuple(n for n in names if n not in replicate_dims and n != shard_dim)
    return MeshRoles(mesh, tuple(n for n in names if n in replicate_dims), shard_dim, model_parallel)


def resolve_roles(mesh: DeviceMesh, enable_param_shard: bool | None, dp_mesh_dims=None) -> MeshRoles:
    """Roles from the dims' names (the default), or from an explicit ``dp_mesh_dims``, which wins. ``mesh``
    has dim names (``named_mesh``)."""
    if enable_param_shard not in (True, False, None):
        raise ValueError(f"enable_param_shard must be True, False or None, got {enable_param_shard!r}")
    names = tuple(mesh.mesh_dim_names)
    if len(set(names)) != len(names):
        raise ValueError(f"mesh dim names must be unique, got {names}")
    if dp_mesh_dims is not None:
        return _explicit_roles(mesh, names, dp_mesh_dims, enable_param_shard)
    model_parallel = tuple(n for n in names if n in MODEL_PARALLEL_DIMS)
    replicate = [n for n in names if n == REPLICATE_DIM]
    data_parallel = [n for n in names if n not in MODEL_PARALLEL_DIMS and n != REPLICATE_DIM]
    if len(data_parallel) > 2 or (replicate and len(data_parallel) > 1):
        raise ValueError(
            f"ambiguous fully_shard mesh {names}: data-parallel dims {data_parallel} (and {replicate}) — "
            "give at most one replicate dim and one shard dim, e.g. flatten dp_shard and cp into 'fsdp' "
            "(ParallelDims views provide it) or name the outer dim 'dp_replicate'"
        )
    if len(data_parallel) == 2:
        replicate.append(data_parallel.pop(0))
    shard_dim = data_parallel[0] if data_parallel else None
    if enable_param_shard is True and shard_dim is None:
        raise ValueError(
            f"enable_param_shard=True but the mesh {names} has no dim to shard parameters over "
            f"(replicate: {replicate}, model-parallel: {list(model_parallel)}); pass a mesh with a "
            "data-parallel dim such as 'fsdp', or use enable_param_shard=False/None"
        )
    size = mesh.size(names.index(shard_dim)) if shard_dim else 1
    shard = enable_param_shard is True or (enable_param_shard is None and size > 1)
    if shard_dim is not None and not shard:
        replicate.append(shard_dim)
        shard_dim = None
    replicate_dims = tuple(n for n in names if n in replicate)
    return MeshRoles(mesh, replicate_dims, shard_dim, model_parallel)
