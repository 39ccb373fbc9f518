"""``mesh_views.clear_mesh_caches`` clears every ``functools`` cache of ``torch.distributed``, also one that
``gc.freeze`` moved out of ``gc.get_objects`` after it was first found (the pool workers freeze what
survives a run: ``launch.processes.pool_worker.freeze_survivors``). In one process, no process group."""

from __future__ import annotations

import functools
import gc
import sys
import types

from hyper_parallel.mesh_views import clear_mesh_caches


def _module_with_cache(name: str):
    module = types.ModuleType(name)

    @functools.lru_cache(None)
    def cached(value):
        return value

    cached.__module__ = name
    module.cached = cached
    sys.modules[name] = module
    return cached


def test_a_cache_frozen_after_it_was_found_is_still_cleared():
    names = ["torch.distributed._hp_probe_cache", "torch.distributed._hp_probe_later_import"]
    try:
        cache = _module_with_cache(names[0])
        clear_mesh_caches()  # found by this scan
        cache(1)
        gc.freeze()  # now absent from gc.get_objects()
        _module_with_cache(names[1])  # a module imported since: the next call scans again
        clear_mesh_caches()
        assert cache.cache_info().currsize == 0
    finally:
        gc.unfreeze()
        for name in names:
            sys.modules.pop(name, None)


def test_a_slice_is_built_once_per_mesh_and_names_and_equals_torchs():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from hyper_parallel.mesh_slices import sub_mesh

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
        other = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
        first = sub_mesh(mesh, ("a", "c"))
        assert sub_mesh(mesh, ("a", "c")) is first and first == mesh["a", "c"]
        assert first.mesh.tolist() == mesh["a", "c"].mesh.tolist() and first.mesh_dim_names == ("a", "c")
        assert sub_mesh(mesh, "b") is not first and sub_mesh(mesh, "b") == mesh["b"]
        assert sub_mesh(other, ("a", "c")) is not first  # kept per mesh object, not per equal mesh
    finally:
        clear_mesh_caches()
        dist.destroy_process_group()
