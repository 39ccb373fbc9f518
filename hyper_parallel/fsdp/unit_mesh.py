"""What one ``fully_shard`` call's mesh resolves to, once: the named mesh, the roles of its dims, the device,
and every group the unit's collectives use.

    sharded_group      the dim the unit shards over (reduce-scatter, all-gather); no dim: a group of one
    unsharded_group    the dims it replicates over (HSDP's all-reduce, the pure-TP compat path)
    model-parallel     one per TP/EP dim and rank set its parameters already carry (the partial-gradient sums),
                       shared by every parameter on the same ranks
    post-forward       ``reshard_after_forward=k``: k consecutive ranks of the shard group

Resolved before any parameter is touched, so a mesh or a ``reshard_after_forward`` that does not fit is refused
with the module as it was. The parameters (``param.ShardedParam``) and their groups (``param_group.ParamGroup``)
read these; none of them turns the mesh into groups again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hyper_parallel.comm import GroupInfo
from hyper_parallel.devices import default_device_type, device_of
from hyper_parallel.fsdp.roles import MeshRoles, named_mesh, resolve_roles
from hyper_parallel.mesh_dims import MeshDim


def default_mesh() -> DeviceMesh:
    """FSDP2's default: every rank of the default process group on one ``fsdp`` dim."""
    if not dist.is_initialized():
        raise RuntimeError("fully_shard needs torch.distributed initialised (init_process_group) first")
    return init_device_mesh(default_device_type(), (dist.get_world_size(),), mesh_dim_names=(MeshDim.FSDP,))


@dataclass
class UnitMesh:
    mesh: DeviceMesh
    roles: MeshRoles
    device: torch.device
    sharded_group: GroupInfo
    unsharded_group: GroupInfo
    reshard_after_forward: bool | None = None  # None: FSDP2's default (every unit but the root)
    post_forward_group: GroupInfo | None = None  # reshard_after_forward=k: the k ranks a unit keeps between passes
    _model_parallel: dict[tuple[str, tuple[int, ...]], GroupInfo] = field(default_factory=dict)

    @classmethod
    def resolve(
        cls, mesh: DeviceMesh | None, enable_param_shard: bool | None, dp_mesh_dims=None, reshard_after_forward=None
    ) -> UnitMesh:
        """``mesh`` (FSDP2's default when None; an unnamed one read by position) with its roles and groups."""
        mesh = named_mesh(mesh) if mesh is not None else default_mesh()
        roles = resolve_roles(mesh, enable_param_shard, dp_mesh_dims)
        unit = cls(
            mesh,
            roles,
            device_of(mesh),
            GroupInfo.from_mesh(mesh, (roles.shard_dim,) if roles.shard_dim else ()),
            GroupInfo.from_mesh(mesh, roles.replicate_dims),
        )
        unit.reshard_after_forward, unit.post_forward_group = unit._post_forward(reshard_after_forward)
        return unit

    def model_parallel_groups(self, combined: DeviceMesh, dims: tuple[str, ...]) -> dict[str, GroupInfo]:
        """The groups of a parameter's model-parallel ``dims`` on its ``combined`` mesh, one per dim and rank
        set for the whole unit."""
        groups = {}
        for dim in dims:
            ranks = tuple(int(r) for r in combined[dim].mesh.flatten().tolist())
            if (dim, ranks) not in self._model_parallel:
                self._model_parallel[(dim, ranks)] = GroupInfo.from_mesh(combined, (dim,))
            groups[dim] = self._model_parallel[(dim, ranks)]
        return groups

    def _post_forward(self, reshard_after_forward) -> tuple[bool | None, GroupInfo | None]:
        """``reshard_after_forward`` as a bool/None, and for an int k the group of k ranks to reshard to.

        As FSDP2: k must divide the shard group's size n; k = 1 means False, k = n means True; otherwise
        after forward each rank keeps n/k of the n shards, and backward all-gathers over k consecutive
        ranks of the shard group (e.g. one node) instead of all n.
        """
        if reshard_after_forward is None or isinstance(reshard_after_forward, bool):
            return reshard_after_forward, None
        if not isinstance(reshard_after_forward, int):
            raise ValueError(f"reshard_after_forward must be a bool, None or an int, got {reshard_after_forward!r}")
        roles = self.roles
        size, k = roles.shard_size, reshard_after_forward
        if k < 1 or size % k:
            raise ValueError(
                f"reshard_after_forward={k}: an int must divide the shard group's size {size} "
                f"(the ranks of {roles.shard_dim or 'no shard dim'}); use one of "
                f"{[d for d in range(1, size + 1) if size % d == 0]}, True or False"
            )
        if k in (1, size):
            return k == size, None
        names = (f"{roles.shard_dim}_post_forward_replica", f"{roles.shard_dim}_post_forward")
        inner = self.mesh[roles.shard_dim]._unflatten(0, (size // k, k), names)
        return True, GroupInfo.from_mesh(inner, (names[1],))
