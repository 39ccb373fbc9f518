"""FSDP2's three prefetch setters on ours (docs/fully_shard.md): which all-gather each issues, and when.

One process on torch's fake process group of 4 ranks (its collectives return at once, our traced comm still
records each one with its issue time), a root over three Linear units ``0``, ``1``, ``2``. Without a setter,
forward gathers each unit in its own pre-forward hook, in module order, and backward gathers the unit
backward reaches and prefetches the one before it (one unit ahead). The orders below follow from the
setters' definitions alone: FSDP2's ``set_modules_to_forward_prefetch`` / ``_backward_prefetch`` make a
unit's hook also gather the listed units; ``set_implicit_forward_prefetch`` gathers the next unit before the
current one computes.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from hyper_parallel import fully_shard, trace
from hyper_parallel.mesh_dims import MeshDim


@pytest.fixture
def model():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,), mesh_dim_names=(MeshDim.FSDP,))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 12), nn.Linear(12, 4))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        yield fully_shard(model, mesh=mesh)
    finally:
        dist.destroy_process_group()


def second_step(model: nn.Module) -> list[dict]:
    """The traced events of a training step after a first one (which records the units' order), by issue time."""
    with trace.record() as recorder:
        for step in range(2):
            trace.set_step(step)
            trace.set_phase("forward")
            loss = model(torch.randn(2, 8)).sum()
            trace.set_phase("backward")
            loss.backward()
    events = [e for e in recorder.events if e["step"] == 1 and e["kind"] in ("collective", "compute")]
    return sorted(events, key=lambda e: e["t_start"])


def gathers(events: list[dict], phase: str) -> list[str]:
    """The units whose all-gathers ``phase`` issued, in issue order."""
    return [
        e["module"] for e in events if e["kind"] == "collective" and e["op"] == "all_gather" and e["phase"] == phase
    ]


def issued_before_compute(events: list[dict], gathered: str, computing: str) -> bool:
    """Whether unit ``gathered``'s forward all-gather was issued before unit ``computing`` began its forward."""
    gather = next(
        e for e in events if e["kind"] == "collective" and e["module"] == gathered and e["phase"] == "forward"
    )
    compute = next(e for e in events if e["kind"] == "compute" and e["module"] == computing and e["phase"] == "forward")
    return gather["t_start"] < compute["t_start"]


def test_without_a_setter_each_unit_gathers_in_its_own_hook(model):
    events = second_step(model)
    assert gathers(events, "forward") == ["0", "1", "2"]
    assert not issued_before_compute(events, "1", "0")
    assert gathers(events, "backward") == ["2", "1", "0"]


def test_forward_prefetch_gathers_the_listed_unit_in_the_hook_of_the_unit_that_lists_it(model):
    model[0].set_modules_to_forward_prefetch([model[2]])
    events = second_step(model)
    assert gathers(events, "forward") == ["0", "2", "1"]  # 2's all-gather in 0's pre-forward, before 0 computes
    assert issued_before_compute(events, "2", "0")


def test_backward_prefetch_gathers_the_listed_unit_instead_of_the_one_before(model):
    model[2].set_modules_to_backward_prefetch([model[0]])
    events = second_step(model)
    assert gathers(events, "backward") == ["2", "0", "1"]  # 1 is gathered by its own hook, 0 already was
    assert gathers(events, "forward") == ["0", "1", "2"]


def test_implicit_forward_prefetch_gathers_the_next_unit_before_the_current_one_computes(model):
    model.set_implicit_forward_prefetch(True)
    events = second_step(model)
    assert gathers(events, "forward") == ["0", "1", "2"]
    assert issued_before_compute(events, "0", "root")
    assert issued_before_compute(events, "1", "0") and issued_before_compute(events, "2", "1")
