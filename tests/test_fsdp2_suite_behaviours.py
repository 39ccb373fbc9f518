"""Behaviours of torch's own FSDP2 test suite that ours once failed (docs/fully_shard.md, "torch's FSDP2 test
suite"), each held side by side with torch's ``fully_shard`` in one process: a gloo group of one rank, so the
numbers come from the same arithmetic on both sides and must be equal bit for bit."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard as torch_fully_shard

from hyper_parallel import fully_shard


@pytest.fixture(scope="module")
def mesh():
    if dist.is_initialized():
        pytest.skip("another test module holds the default process group")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    finally:
        dist.destroy_process_group()


def _stack() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3)))


def _train_with_post_optim_events(shard, mesh) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """torch's ``test_post_optim_event``: after every optimizer step the root gets the event recorded on the
    current stream (``None`` on a CPU stream, as there)."""
    model = _stack()
    for block in model:
        shard(block, mesh=mesh)
    shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def post_step(*_):
        model.set_post_optim_event(torch.get_device_module("cpu").current_stream().record_event())

    optim.register_step_post_hook(post_step)
    losses = []
    for step in range(3):
        inp = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        optim.zero_grad()
        loss = model(inp).sum()
        loss.backward()
        optim.step()
        losses.append(loss.detach())
    return losses, [p.full_tensor() for p in model.parameters()]


def test_post_optim_event_is_accepted_and_trains_as_fsdp2(mesh):
    ours_losses, ours_params = _train_with_post_optim_events(fully_shard, mesh)
    torch_losses, torch_params = _train_with_post_optim_events(torch_fully_shard, mesh)
    assert torch.equal(torch.stack(ours_losses), torch.stack(torch_losses))
    for ours, theirs in zip(ours_params, torch_params, strict=True):
        assert torch.equal(ours, theirs)
    assert not torch.equal(ours_params[0], _stack()[0][0].weight), "the optimizer moved the weights"
