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
from torch.distributed.tensor import DTensor

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


def _train(model, optim, steps: int, shape=(4, 8), loss=lambda out: out.sum()) -> list[torch.Tensor]:
    """``steps`` optimizer steps on seeded random inputs of ``shape``; the losses."""
    losses = []
    for step in range(steps):
        optim.zero_grad()
        value = loss(model(torch.randn(*shape, generator=torch.Generator().manual_seed(step))))
        value.backward()
        optim.step()
        losses.append(value.detach())
    return losses


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
    losses = _train(model, optim, 3)
    return losses, [p.full_tensor() for p in model.parameters()]


def test_post_optim_event_is_accepted_and_trains_as_fsdp2(mesh):
    ours_losses, ours_params = _train_with_post_optim_events(fully_shard, mesh)
    torch_losses, torch_params = _train_with_post_optim_events(torch_fully_shard, mesh)
    assert torch.equal(torch.stack(ours_losses), torch.stack(torch_losses))
    for ours, theirs in zip(ours_params, torch_params, strict=True):
        assert torch.equal(ours, theirs)
    assert not torch.equal(ours_params[0], _stack()[0][0].weight), "the optimizer moved the weights"


def _train_with_all_reduce_hook(shard, mesh) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """torch's ``test_custom_hsdp_all_reduce_hook`` in one process: the hook rewrites the reduced gradient
    shard in place (here: halves it), which every parameter's gradient must then show."""
    model = _stack()
    for block in model:
        shard(block, mesh=mesh)
    shard(model, mesh=mesh)
    calls = []

    def halve(reduced: torch.Tensor) -> None:
        calls.append(reduced.dtype)
        reduced.mul_(0.5)

    for block in model:
        block.set_all_reduce_hook(halve)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = _train(model, optim, 2)
    grads = [p.grad.full_tensor() for p in model.parameters()]
    return losses, grads, len(calls)


def test_all_reduce_hook_rewrites_the_reduced_gradients_as_fsdp2s(mesh):
    ours_losses, ours_grads, ours_calls = _train_with_all_reduce_hook(fully_shard, mesh)
    torch_losses, torch_grads, torch_calls = _train_with_all_reduce_hook(torch_fully_shard, mesh)
    assert (ours_calls, torch_calls) == (6, 6), "once per block and backward"
    assert torch.equal(torch.stack(ours_losses), torch.stack(torch_losses))
    for ours, theirs in zip(ours_grads, torch_grads, strict=True):
        assert torch.equal(ours, theirs)
    plain = _stack()
    plain(torch.randn(4, 8, generator=torch.Generator().manual_seed(0))).sum().backward()
    assert not torch.equal(ours_grads[0], plain[0][0].weight.grad), "the hook changed the gradients"


class _Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scalar_p = nn.Parameter(torch.tensor(1.0))


def _refusals(mesh):
    """(what is applied, FSDP2's exception type, FSDP2's words) of the refusals torch's test_fully_shard_init
    checks; ours raises an error of the same type with the same words."""
    from torch.distributed.tensor import Shard

    def meta_forward(shard):
        with torch.device("meta"):
            model = nn.Sequential(nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4)))
        for block in model:
            shard(block, mesh=mesh)
        shard(model, mesh=mesh)
        model(torch.randn(2, 4))

    return [
        (
            lambda shard: shard(nn.Linear(4, 4), mesh=init_device_mesh("cpu", (1, 1, 1))),
            ValueError,
            "fully_shard expects a 1D or 2D DeviceMesh but got DeviceMesh",
        ),
        (
            lambda shard: shard(_Scalar(), mesh=mesh),
            ValueError,
            "Change scalar_p to a 1D tensor with numel equal to 1.",
        ),
        (
            lambda shard: shard(nn.Linear(4, 4), mesh=mesh, shard_placement_fn=lambda p: Shard(1)),
            AssertionError,
            "Shard dim 1 is invalid for 1D tensor",
        ),
        (
            meta_forward,
            RuntimeError,
            r"FSDP parameters should be materialized from meta device before training, but the following were "
            r"still on meta device: \['0.0.weight', '0.0.bias'\]",
        ),
        *_spmd_refusals(mesh),
    ]


def _spmd_refusals(mesh):
    """The ``dp_mesh_dims`` refusals torch's test_fully_shard_dtensor checks: a dim name the mesh lacks, and a
    parameter already sharded over the data-parallel dim."""
    from torch.distributed.fsdp import DataParallelMeshDims
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def sharded_over_fsdp(shard):
        layer = nn.Linear(4, 4, bias=False)
        layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Shard(0)]))
        shard(layer, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))

    def unknown_dim(shard):
        layer = nn.Linear(4, 4, bias=False)
        layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Replicate()]))
        shard(layer, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="nonexistent"))

    return [
        (unknown_dim, ValueError, "not found in mesh.mesh_dim_names"),
        (sharded_over_fsdp, ValueError, "Expected Replicate"),
    ]


@pytest.mark.parametrize(
    "case", range(6), ids=["mesh_3d", "scalar", "shard_dim", "meta", "dp_mesh_dims_name", "dp_placement"]
)
def test_ours_refuses_as_fsdp2_refuses(mesh, case):
    apply, error, words = _refusals(mesh)[case]
    for shard in (torch_fully_shard, fully_shard):
        with pytest.raises(error, match=words):
            apply(shard)


def _train_convs(shard, mesh, channels_last: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 6, 3), nn.ReLU(), nn.Conv2d(6, 2, 3))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        assert not model[0].weight.is_contiguous()
    shard(model, mesh=mesh)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = _train(model, optim, 2, shape=(2, 4, 8, 8), loss=lambda out: out.square().sum())
    return torch.stack(losses), [p.full_tensor() for p in model.parameters()]


def test_channels_last_parameters_which_fsdp2_refuses_train_as_its_contiguous_copy(mesh):
    """torch's test_raise_noncontiguous_parameter: FSDP2 refuses a channels_last weight; ours shards it and
    trains the numbers FSDP2 trains on the same weights laid out contiguously."""
    with pytest.raises(NotImplementedError, match="non-contiguous"):
        torch_fully_shard(nn.Conv2d(8, 8, 3).to(memory_format=torch.channels_last), mesh=mesh)
    ours_losses, ours_params = _train_convs(fully_shard, mesh, channels_last=True)
    torch_losses, torch_params = _train_convs(torch_fully_shard, mesh, channels_last=False)
    assert torch.equal(ours_losses, torch_losses)
    for ours, theirs in zip(ours_params, torch_params, strict=True):
        assert torch.equal(ours, theirs)


def _state_dicts_after_forward(shard, mesh) -> tuple[list[dict], torch.Tensor, list[torch.Tensor]]:
    """torch's ``test_dp_state_dict_save_load``: with ``reshard_after_forward=False`` a forward leaves the
    parameters unsharded; ``state_dict()`` then (between forward and backward too) still gives the sharded
    DTensors, and training goes on as if it had not been called."""
    model = _stack()
    for block in model:
        shard(block, mesh=mesh, reshard_after_forward=False)
    shard(model, mesh=mesh, reshard_after_forward=False)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    inp = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(inp)
    state_dicts = [model.state_dict()]
    before_step = {name: value.detach().clone() for name, value in state_dicts[0].items()}  # values are views
    loss = model(inp).sum()
    state_dicts.append(model[0].state_dict())
    loss.backward()
    optim.step()
    model(inp)
    state_dicts.append(model.state_dict())
    model.load_state_dict(before_step)  # back to the weights before the step, loaded after a forward
    return state_dicts, loss.detach(), [p.full_tensor() for p in model.parameters()]


def test_state_dict_after_a_forward_that_kept_parameters_unsharded_is_sharded_as_fsdp2s(mesh):
    ours_dicts, ours_loss, ours_params = _state_dicts_after_forward(fully_shard, mesh)
    torch_dicts, torch_loss, torch_params = _state_dicts_after_forward(torch_fully_shard, mesh)
    assert torch.equal(ours_loss, torch_loss)
    for ours, theirs in zip(ours_dicts, torch_dicts, strict=True):
        assert list(ours) == list(theirs)
        for name, value in ours.items():
            assert type(value) is type(theirs[name]) is DTensor, name  # (one rank: ours Replicate, FSDP2 Shard(0))
            assert torch.equal(value.full_tensor(), theirs[name].full_tensor()), name
    for ours, theirs in zip(ours_params, torch_params, strict=True):
        assert torch.equal(ours, theirs)
    assert torch.equal(ours_params[0], _stack()[0][0].weight), "the load restored the weights before the step"


def _train_stack(shard, mesh, **kwargs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Three AdamW steps of ``_stack`` under one ``shard`` call with ``kwargs``."""
    model = _stack()
    shard(model, mesh=mesh, **kwargs)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = _train(model, optim, 3)
    return losses, [p.full_tensor() for p in model.parameters()]


def test_plain_parameters_with_dp_mesh_dims_which_fsdp2_refuses_train_as_fsdp2_without_it(mesh):
    """torch's ``test_validation_spmd_mesh_non_dtensor_params``: FSDP2 refuses plain parameters with
    ``dp_mesh_dims``; ours (wider, docs/fully_shard.md) shards them as without it, bit-equal to FSDP2 there."""
    from torch.distributed.fsdp import DataParallelMeshDims

    with pytest.raises(ValueError, match="must be DTensors"):
        torch_fully_shard(_stack(), mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))
    ours_losses, ours_params = _train_stack(fully_shard, mesh, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))
    torch_losses, torch_params = _train_stack(torch_fully_shard, mesh)
    assert torch.equal(torch.stack(ours_losses), torch.stack(torch_losses))
    for ours, theirs in zip(ours_params, torch_params, strict=True):
        assert torch.equal(ours, theirs)
    assert not torch.equal(ours_params[0], _stack()[0][0].weight), "the optimizer moved the weights"


def _grads_with_root_divide_factor(shard, mesh) -> list[torch.Tensor]:
    """torch's ``test_set_reduce_scatter_divide_factor`` in one process: the root's own parameters (the last
    Linear) are divided by the factor set on the root, the nested units' by their data-parallel world."""
    model = nn.Sequential(*_stack(), nn.Linear(8, 8))
    for block in model[:3]:
        shard(block, mesh=mesh)
    shard(model, mesh=mesh)
    model.set_gradient_divide_factor(4.0)
    model(torch.randn(4, 8, generator=torch.Generator().manual_seed(0))).sum().backward()
    return [p.grad.full_tensor() for p in model.parameters()]


def test_gradient_divide_factor_set_on_the_root_divides_only_its_own_parameters_as_fsdp2(mesh):
    ours, theirs = (
        _grads_with_root_divide_factor(fully_shard, mesh),
        _grads_with_root_divide_factor(torch_fully_shard, mesh),
    )
    for mine, fsdp2 in zip(ours, theirs, strict=True):
        assert torch.equal(mine, fsdp2)
    plain = nn.Sequential(*_stack(), nn.Linear(8, 8))
    plain(torch.randn(4, 8, generator=torch.Generator().manual_seed(0))).sum().backward()
    expected = [p.grad for p in plain.parameters()]
    assert all(torch.equal(mine, want) for mine, want in zip(ours[:6], expected[:6])), "the blocks: world 1"
    assert all(torch.equal(mine, want / 4.0) for mine, want in zip(ours[6:], expected[6:])), "the root: / 4"


@pytest.mark.parametrize("value", [0, 2.5, True])
def test_reduce_scatter_max_input_buffers_is_validated_as_fsdp2(mesh, value):
    raised = []
    for shard in (fully_shard, torch_fully_shard):
        with pytest.raises((TypeError, ValueError)) as error:
            shard(nn.Linear(4, 4), mesh=mesh).set_reduce_scatter_max_input_buffers(value)
        raised.append((error.type, str(error.value)))
    assert raised[0] == raised[1]


def _train_with_two_reduce_scatter_buffers(shard, mesh) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """torch's ``test_set_reduce_scatter_max_input_buffers``: a scheduling dial, the numbers are unchanged."""
    model = _stack()
    for block in model:
        shard(block, mesh=mesh)
    shard(model, mesh=mesh)
    model.set_reduce_scatter_max_input_buffers(2)
    losses = _train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), 3)
    return losses, [p.full_tensor() for p in model.parameters()]


def test_reduce_scatter_max_input_buffers_is_accepted_and_trains_as_fsdp2(mesh):
    ours_losses, ours_params = _train_with_two_reduce_scatter_buffers(fully_shard, mesh)
    torch_losses, torch_params = _train_with_two_reduce_scatter_buffers(torch_fully_shard, mesh)
    assert torch.equal(torch.stack(ours_losses), torch.stack(torch_losses))
    assert all(torch.equal(a, b) for a, b in zip(ours_params, torch_params, strict=True))


def _train_replicated_around_units(shard) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """torch's ``test_unshard_async``: ``replicate()`` (DDP) over a model whose inner blocks are fully_shard
    units; DDP must leave the units' sharded parameters to them and all-reduce only the others."""
    from torch.distributed._composable import replicate

    model = nn.Sequential(*_stack(), nn.Linear(8, 8))
    for block in model[:3]:
        shard(block)
    replicate(model)
    losses = _train(model, torch.optim.Adam(model.parameters(), lr=1e-2), 3)
    return losses, [p.full_tensor() if isinstance(p, DTensor) else p.detach() for p in model.parameters()]


def test_replicate_over_fully_shard_units_trains_as_fsdp2(mesh):
    ours_losses, ours_params = _train_replicated_around_units(fully_shard)
    torch_losses, torch_params = _train_replicated_around_units(torch_fully_shard)
    assert torch.equal(torch.stack(ours_losses), torch.stack(torch_losses))
    assert all(torch.equal(a, b) for a, b in zip(ours_params, torch_params, strict=True))
