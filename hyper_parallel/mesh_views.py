"""The DeviceMeshes of a ParallelDims: every view unflattened from one 1-D world mesh.

Because all views share that root, a DTensor placed by TP on ``views["tp"]`` and the FSDP dims on
``views["dp_replicate", "fsdp"]`` can be joined into one mesh with ``DeviceMesh._concatenate``.
"""

from __future__ import annotations

import functools
import gc
import sys
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, _mesh_resources, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._redistribute import clear_redistribute_planner_cache

from hyper_parallel.devices import default_device_type, device_of
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_slices import sub_mesh


@dataclass
class MeshViews:
    dims: ParallelDims
    world: DeviceMesh
    meshes: dict[str, DeviceMesh]  # view name -> mesh with that view's dims

    @property
    def device(self) -> torch.device:
        """The device of this rank's tensors on these meshes (the GPU of this rank, or the CPU)."""
        return device_of(self.world)

    @property
    def dense(self) -> DeviceMesh:
        """(dp_replicate, dp_shard, cp, tp): the dense root view."""
        return self.meshes["dense"]

    @property
    def sparse(self) -> DeviceMesh:
        """(dp_replicate, efsdp, ep[, etp]): where experts live; only when ep > 1."""
        if "sparse" not in self.meshes:
            raise ValueError("there is no sparse (expert) mesh: ep=1")
        return self.meshes["sparse"]

    def __getitem__(self, names: str | tuple[str, ...]) -> DeviceMesh:
        """A (sub)mesh by dim names, e.g. ``views["fsdp"]`` or ``views["dp_replicate", "fsdp", "tp"]``."""
        wanted = (names,) if isinstance(names, str) else tuple(names)
        for mesh in self.meshes.values():
            present = mesh.mesh_dim_names
            if all(name in present for name in wanted):
                positions = [present.index(name) for name in wanted]
                if positions == sorted(positions):
                    return mesh if wanted == present else sub_mesh(mesh, wanted)
        known = sorted({n for mesh in self.meshes.values() for n in mesh.mesh_dim_names})
        raise ValueError(
            f"no view has the dims {wanted} in this order; known dims: {known} "
            "(dims of one view must be given outermost first)"
        )

    def group_names(self) -> dict[tuple[int, ...], str]:
        """This rank's groups (sorted global ranks) -> mesh dim name, so traces of torch's own
        collectives (DTensor) can name their dim. Where dims share ranks, the model-parallel name wins."""
        rank = dist.get_rank()
        names: dict[tuple[int, ...], str] = {}
        for dim in (
            MeshDim.TP,
            MeshDim.CP,
            MeshDim.ULYSSES,
            MeshDim.EP,
            MeshDim.ETP,
            MeshDim.FSDP,
            MeshDim.EFSDP,
            MeshDim.DP_REPLICATE,
            MeshDim.DP_SHARD,
            MeshDim.DP,
            MeshDim.DP_CP,
        ):
            try:
                ranks = tuple(self.dims.group_of(dim, rank))
            except ValueError:  # e.g. no ep dims when ep == 1
                continue
            if len(ranks) > 1:
                names.setdefault(ranks, dim)
        return names

    def all_group_ranks(self, dim: str) -> list[list[int]]:
        """Every group of ``dim`` as read from the DeviceMesh itself (independent of ParallelDims' arithmetic)."""
        for mesh in self.meshes.values():
            if dim in mesh.mesh_dim_names:
                index = mesh.mesh_dim_names.index(dim)
                full = mesh.mesh.movedim(index, -1).reshape(-1, mesh.mesh.shape[index])
                return sorted(sorted(group) for group in full.tolist())
        raise ValueError(f"unknown mesh dim {dim!r}")


def build_mesh(dims: ParallelDims, device_type: str | None = None) -> MeshViews:
    """Every view of ``dims`` as a DeviceMesh over one root; needs an initialised process group.
    ``device_type``: the GPU when torch sees one, else the CPU (``devices.default_device_type``).

    A function here rather than a ParallelDims method, so ``hyper_parallel.mesh`` stays torch-free and
    imports nothing back from this module."""
    if not dist.is_initialized():
        raise RuntimeError("build_mesh needs torch.distributed initialised (init_process_group) first")
    if dist.get_world_size() != dims.world_size:
        raise ValueError(
            f"the process group has {dist.get_world_size()} ranks but ParallelDims.world_size="
            f"{dims.world_size}; start the run with --nproc-per-node {dims.world_size}"
        )
    world = init_device_mesh(device_type or default_device_type(), (dims.world_size,), mesh_dim_names=(MeshDim.WORLD,))
    meshes = {}
    for name, view in dims.views().items():
        names = tuple(dim for dim, _ in view)
        sizes = tuple(size for _, size in view)
        meshes[name] = world._unflatten(0, sizes, names)
    return MeshViews(dims, world, meshes)


_LRU_CACHE = type(functools.lru_cache(None)(int))
_torch_caches: dict[int, weakref.ref] = {}
_modules_scanned = 0


def _torch_distributed_caches() -> list:
    """Every ``functools`` cache defined in ``torch.distributed`` (rescanned when modules were imported since).

    torch memoises with caches keyed by a DeviceMesh or a DTensorSpec (``MeshTopoInfo.build_from_mesh``,
    the sharding propagator, the redistribute planner, ...): each one keeps a finished run's meshes, and
    with them their gloo groups, alive. Clearing all of them covers those and any a later torch adds;
    they refill on the next run.

    A rescan adds to what earlier scans found (weakly: a cache of an object that is gone drops out):
    ``gc.get_objects`` does not list objects moved out of the collector by ``gc.freeze`` (the pool
    workers freeze what they hold between runs), and a cache found before its freeze must stay cleared."""
    global _modules_scanned
    if len(sys.modules) != _modules_scanned:
        _modules_scanned = len(sys.modules)
        for obj in gc.get_objects():
            if type(obj) is _LRU_CACHE and str(getattr(obj, "__module__", "")).startswith("torch.distributed"):
                known = _torch_caches.get(id(obj))
                if known is None or known() is not obj:  # new, or a dead cache's id reused
                    _torch_caches[id(obj)] = weakref.ref(obj)
    live = []
    for key, ref in list(_torch_caches.items()):
        cache = ref()
        if cache is None:
            del _torch_caches[key]
        else:
            live.append(cache)
    return live


def clear_mesh_caches() -> None:
    """DTensor's caches keyed by (or holding) meshes, and the mesh stack: a mesh keeps its subgroups. After
    this the next DTensor op pays its first (uncached) sharding propagation again, as a fresh run does, and a
    warm-pool worker keeps no finished run's process groups.

    Besides every ``functools`` cache of ``torch.distributed`` (``_gen_transform_infos`` among them), the
    sharding propagator (its own LRU class, and the C++ fast path) and the redistribute planner keep their own; they are cleared as
    ``torch.distributed.tensor.debug._clear_sharding_prop_cache`` does (importing that module pulls in
    dynamo and inductor, 0.45 s of every rank's start)."""
    for cache in _torch_distributed_caches():
        cache.cache_clear()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    torch._C._clear_DTensor_sharding_propagator_cache()
    clear_redistribute_planner_cache()
    _mesh_resources.mesh_stack.clear()
