"""fully_shard's gradient accumulation (docs/design.md §3): two micro-batches per step with reduction switched
off for the first (set_requires_gradient_sync under FSDP, set_requires_all_reduce under HSDP), checked
against one process's step on the whole global batch (numbers) and against the hand-derived collectives of
each micro-batch (no reduce-scatter, or no all-reduce, until the last); gradients of parameters used only in
the first micro-batch must still arrive.

Each case reads as a specification: the function the ranks run (``@case``; tests/fully_shard_worker.py
runs every case of a world size in one launch per session) sits above the tests that assert on what it
recorded.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
from fully_shard_expectations import (
    BLOCK_S2,
    BLOCK_S4,
    FSDP4,
    HSDP_FSDP,
    HSDP_REP,
    ROOT_S4,
    assert_collectives,
    assert_numbers,
    fsdp_unit,
    hsdp_step,
)
from fully_shard_training import (
    CONFIG,
    LR,
    STEPS,
    Result,
    apply_ours,
    batch,
    case,
    full,
    full_grads,
    full_params,
    global_mean,
    mse,
    new_mlp,
    param_facts,
    this_rank,
)

from hyper_parallel import trace
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh

# ------------------------------------------------------------------ what the ranks run: shared pieces


def _accumulate(
    res: Result, dims: ParallelDims, mesh_names: tuple[str, ...], seed: int, skip: Callable[[nn.Module, bool], None]
) -> None:
    """Two optimizer steps, each of two micro-batches (this rank's rows split in half, loss / 2);
    ``skip(model, first_micro)`` switches synchronisation. Trace step label = 2*step + micro."""
    views = build_mesh(dims, "cpu")
    model = new_mlp(seed)
    reference = copy.deepcopy(model)
    apply_ours(model, views[mesh_names])
    res.facts["params"] = param_facts(model)
    x, y, gx, gy = batch(seed + 10, dims.coordinates(this_rank())[MeshDim.DP], dims.dp)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    res.facts["grad_after_first_micro"] = {}
    micro_x, micro_y = x.chunk(2), y.chunk(2)
    for step in range(STEPS):
        micro_losses = []
        for micro in range(2):
            trace.set_step(2 * step + micro)
            skip(model, micro == 0)
            loss = mse(model(micro_x[micro]), micro_y[micro]) / 2
            loss.backward()
            trace.set_phase("other")
            micro_losses.append(loss)
            if micro == 0:
                res.facts["grad_after_first_micro"][str(step)] = sorted(
                    n for n, p in model.named_parameters() if p.grad is not None
                )
        ref_loss = mse(reference(gx), gy)
        ref_loss.backward()
        res.compare(f"loss{step}:ours-ref", {"loss": global_mean(sum(micro_losses))}, {"loss": ref_loss.detach()})
        res.compare(f"grad{step}:ours-ref", full_grads(model), {n: p.grad for n, p in reference.named_parameters()})
        trace.set_phase("optimizer")
        for opt in (optimizer, ref_opt):
            opt.step()
            opt.zero_grad()
        trace.set_phase("other")
        res.compare(f"param{step}:ours-ref", full_params(model), dict(reference.named_parameters()))


class TwoHeads(nn.Module):
    """A trunk and two heads; each micro-batch uses one head, so head 0's parameters get a gradient only
    in the first micro-batch of a step (the accumulation path must keep it)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(CONFIG.d_in, CONFIG.d_model)
        self.heads = nn.ModuleList(nn.Linear(CONFIG.d_model, CONFIG.d_out) for _ in range(2))

    def forward(self, x: torch.Tensor, head: int) -> torch.Tensor:
        return self.heads[head](torch.relu(self.trunk(x)))


def _accumulate_unused(
    res: Result, dims: ParallelDims, mesh_names: tuple[str, ...], skip: Callable[[nn.Module, bool], None]
) -> None:
    """Micro-batch 0 trains head 0, micro-batch 1 head 1, synchronisation switched by ``skip``; the
    accumulated gradients must equal one process's gradient of the sum of both global losses."""
    views = build_mesh(dims, "cpu")
    torch.manual_seed(23)
    model = TwoHeads()
    reference = copy.deepcopy(model)
    for head in model.heads:
        fully_shard(head, mesh=views[mesh_names])
    fully_shard(model, mesh=views[mesh_names])
    index = dims.coordinates(this_rank())[MeshDim.DP]
    micro = [batch(30 + m, index, dims.dp) for m in range(2)]
    for step in range(STEPS):
        trace.set_step(step)
        for head, (x, y, _, _) in enumerate(micro):
            skip(model, head == 0)
            mse(model(x, head), y).backward()
        ref_loss = sum(mse(reference(gx, head), gy) for head, (_, _, gx, gy) in enumerate(micro))
        ref_loss.backward()
        res.facts.setdefault("missing_grads", []).extend(n for n, p in model.named_parameters() if p.grad is None)
        ours = {n: full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
        res.compare(f"grad{step}:ours-ref", ours, {n: p.grad for n, p in reference.named_parameters() if n in ours})
        for m in (model, reference):
            with torch.no_grad():
                for p in m.parameters():
                    p -= LR * p.grad
                    p.grad = None


pytestmark = pytest.mark.distributed

# ================================================================== gradient accumulation


@case("accumulation_fsdp", 4)
def accumulation_fsdp(res: Result) -> None:
    """FSDP 1-D: set_requires_gradient_sync(False) on the first micro-batch (no RS), True
    on the second (RS of the accumulated sum) == one step on the whole global batch."""

    def skip(model, first):
        model.set_requires_gradient_sync(not first)

    _accumulate(res, ParallelDims(world_size=4), (MeshDim.FSDP,), 21, skip)


def test_gradient_accumulation_fsdp_sync_off_then_on(fully_shard_run4):
    """Two micro-batches per step (trace steps 2k, 2k+1): set_requires_gradient_sync(False) -> the
    first micro-batch only gathers (no RS); True -> the second reduces the sum; == one step on the
    global batch."""
    results = fully_shard_run4.case("accumulation_fsdp")
    assert_numbers(results, "ours-ref")

    def expected(rank, micro):
        g, sync = FSDP4[rank], micro % 2 == 1
        return (
            fsdp_unit("root", "fsdp", g, ROOT_S4, root=True, reduce=sync)
            + fsdp_unit("blocks.0", "fsdp", g, BLOCK_S4, reduce=sync)
            + fsdp_unit("blocks.1", "fsdp", g, BLOCK_S4, reduce=sync)
        )

    assert_collectives(results, expected, steps=(0, 1, 2, 3))
    for _rank, result in results.items():
        assert result["facts"]["grad_after_first_micro"] == {"0": [], "1": []}  # nothing reduced yet


@case("accumulation_hsdp", 4)
def accumulation_hsdp(res: Result) -> None:
    """HSDP (2 x 2): set_requires_all_reduce(False) on the first micro-batch (RS but no AR),
    True on the second (RS + AR of the sum) == one step on the whole global batch."""

    def skip(model, first):
        model.set_requires_all_reduce(not first)

    _accumulate(
        res, ParallelDims(world_size=4, dp_replicate=2, dp_shard=2), (MeshDim.DP_REPLICATE, MeshDim.FSDP), 22, skip
    )


def test_gradient_accumulation_hsdp_all_reduce_off_then_on(fully_shard_run4):
    """HSDP, set_requires_all_reduce(False) on the first micro-batch: RS on fsdp but no AR; True on
    the second: RS + AR of the accumulated sum on dp_replicate."""
    results = fully_shard_run4.case("accumulation_hsdp")
    assert_numbers(results, "ours-ref")

    def expected(rank, micro):
        return hsdp_step(HSDP_FSDP[rank], HSDP_REP[rank] if micro % 2 == 1 else None, BLOCK_S2)

    assert_collectives(results, expected, steps=(0, 1, 2, 3))


@case("accumulation_unused_params_fsdp", 4)
def accumulation_unused_fsdp(res: Result) -> None:
    """FSDP, sync off for micro-batch 0, on for micro-batch 1; head 0 is not used in 1."""

    def skip(model, first):
        model.set_requires_gradient_sync(not first)

    _accumulate_unused(res, ParallelDims(world_size=4), (MeshDim.FSDP,), skip)


@case("accumulation_unused_params_hsdp", 4)
def accumulation_unused_hsdp(res: Result) -> None:
    """HSDP, all-reduce off for micro-batch 0, on for 1; head 0 is not used in 1."""

    def skip(model, first):
        model.set_requires_all_reduce(not first)

    _accumulate_unused(
        res, ParallelDims(world_size=4, dp_replicate=2, dp_shard=2), (MeshDim.DP_REPLICATE, MeshDim.FSDP), skip
    )


@pytest.mark.parametrize("case", ["accumulation_unused_params_fsdp", "accumulation_unused_params_hsdp"])
def test_accumulation_keeps_gradients_of_parameters_used_only_in_earlier_micro_batches(fully_shard_run4, case):
    """Head 0 runs only in the first micro-batch, with synchronisation off: its gradient (parked, or
    reduce-scattered and waiting for the all-reduce) must still arrive when the second micro-batch
    synchronises, equal to one process's gradient of both losses."""
    results = fully_shard_run4.case(case)
    for result in results.values():
        assert result["facts"]["missing_grads"] == []
    assert_numbers(results, "ours-ref", kinds=("grad",))
