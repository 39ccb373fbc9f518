"""hyper_parallel.sharding_memo: a warm-pool run on new meshes of the same shape gets torch's own sharding
decisions without recomputing them, on its own meshes, and the memo keeps no mesh alive.

One process with torch's "fake" process group for 8 ranks (nothing here communicates: every op below
runs on local shards). "A run" is what the pool does between two ``clear_mesh_caches``: new meshes, the
same ops. The reference is torch without the memo, on a third set of meshes."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from hyper_parallel import sharding_memo
from hyper_parallel.mesh_views import clear_mesh_caches

SHAPE, NAMES = (1, 2, 4), ("dp_replicate", "fsdp", "tp")


@pytest.fixture
def fake_world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        yield
    finally:
        clear_mesh_caches()
        dist.destroy_process_group()


@pytest.fixture
def memo(fake_world):
    """The memo under DTensor's propagator for one test; torch's own entry points back afterwards."""
    try:
        yield sharding_memo.install()
    finally:
        sharding_memo.uninstall()


def _run(mesh: DeviceMesh) -> list[DTensor]:
    """A run's ops: elementwise, in-place, a reduction to Partial, a matmul that keeps its sharding."""
    torch.manual_seed(0)
    x = DTensor.from_local(torch.randn(4, 8), mesh, (Replicate(), Shard(0), Shard(1)), run_check=False)
    y = DTensor.from_local(torch.randn(4, 8), mesh, (Replicate(), Shard(0), Shard(1)), run_check=False)
    w = DTensor.from_local(torch.randn(8, 6), mesh, (Replicate(), Replicate(), Shard(0)), run_check=False)
    z = x * 2.0 + y
    z.add_(y, alpha=-0.5)
    total = z.sum()
    return [z, total, z @ w, torch.relu(z).t()]


def _new_run_mesh() -> DeviceMesh:
    clear_mesh_caches()
    return init_device_mesh("cpu", SHAPE, mesh_dim_names=NAMES)


def test_a_new_mesh_of_the_same_shape_gets_torchs_decisions_on_that_mesh(memo):
    _run(_new_run_mesh())
    asked = memo.misses
    assert asked >= 5 and memo.hits == 0
    mesh = _new_run_mesh()
    outputs = _run(mesh)
    assert memo.hits == asked and memo.misses == asked  # every op of the second run answered from the memo

    sharding_memo.uninstall()  # torch alone, on a third mesh, caches cleared
    reference = _run(_new_run_mesh())
    for out, ref in zip(outputs, reference, strict=True):
        assert out._spec == ref._spec and out._spec.placements == ref._spec.placements
        assert out._spec.mesh is mesh  # rebuilt on the asking run's mesh, not an earlier one
        assert torch.equal(out.to_local(), ref.to_local())
    assert reference[1].placements == (Replicate(), Partial(), Partial())  # the sum really left Partial


def test_another_mesh_shape_or_dim_names_is_not_answered(memo):
    _run(_new_run_mesh())
    asked = memo.misses
    clear_mesh_caches()
    _run(init_device_mesh("cpu", SHAPE, mesh_dim_names=("a", "fsdp", "tp")))
    clear_mesh_caches()
    _run(init_device_mesh("cpu", (2, 1, 4), mesh_dim_names=NAMES))
    assert memo.hits == 0 and memo.misses == 3 * asked


def test_bypassed_propagates_as_torch_alone_and_keeps_the_answers(memo):
    first = _run(_new_run_mesh())
    asked = memo.misses
    with sharding_memo.bypassed():
        inside = _run(_new_run_mesh())
        assert (memo.hits, memo.misses) == (0, asked)  # torch propagated every op itself
    for out, ref in zip(inside, first, strict=True):
        assert out._spec.placements == ref._spec.placements and torch.equal(out.to_local(), ref.to_local())
    assert sharding_memo.install() is memo  # the same memo is back under the propagator
    _run(_new_run_mesh())
    assert memo.hits == asked  # with the answers of before the bypass


def _reachable(roots) -> list:
    """Objects reachable from ``roots``, not through an operator (its kernels reach every module)."""
    seen, todo, found = set(), list(roots), []
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, torch._ops.OpOverload)):
            continue
        seen.add(id(obj))
        found.append(obj)
        todo.extend(gc.get_referents(obj))
    return found


def test_the_memo_holds_no_mesh_group_or_tensor(memo):
    _run(_new_run_mesh())
    held = _reachable([memo._answers])
    assert len(memo._answers) >= 5
    assert not [obj for obj in held if isinstance(obj, (DeviceMesh, torch.Tensor, dist.ProcessGroup))]


def test_install_is_idempotent(memo):
    assert sharding_memo.install() is memo
