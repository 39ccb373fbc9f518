"""torchrun worker for tests/test_fully_shard.py: the test matrix of docs/design.md §3 (cases 1-10).

One launch runs many cases in one gloo process group (a torchrun start costs 10-19 s here). Every
case builds its own ``build_mesh(ParallelDims(world_size=W, ...), "cpu")`` views, trains a tiny model
with our ``fully_shard`` for two SGD steps next to

* an unparallelized deepcopy trained on the global batch (the reference), and where asked
* the same model under torch's own ``torch.distributed.fsdp.fully_shard`` (an independent oracle),

and records, per rank:

* ``numbers``: for each compared quantity (loss / grads via ``full_tensor()`` / params after each
  step) the largest absolute difference and the largest ``|a-b| / (atol + rtol*|b|)`` ratio, per
  tensor (ratio <= 1 is ``torch.allclose``); tolerances come from the test (``--tolerances``);
* ``facts``: GroupInfo / sizes / placements of the managed parameters and case-specific findings;
* ``collectives`` and ``placements``: the trace events (``hyper_parallel.trace``) of the case.

A case that raises does not stop the others: the traceback is recorded and the ranks meet at a
barrier before the next case. (The cases are SPMD, so an error is raised on every rank at the same
point; a rank left waiting in a collective by an error elsewhere gives up after
``--collective-timeout`` seconds.) Output: ``$HYPER_PARALLEL_RUN_DIR/fully_shard_rank{r}.json``.

    torchrun --nproc-per-node 4 tests/workers/fully_shard_cases.py --cases all --tolerances '{...}'
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy as TorchMixedPrecisionPolicy
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from hyper_parallel import trace
from hyper_parallel.fsdp import MixedPrecisionPolicy, fully_shard
from hyper_parallel.fsdp.state_dict import get_full_state_dict, load_full_state_dict
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_views import build_mesh
from hyper_parallel.models.mlp import MLP, MLPBlock, MLPConfig, mlp_batch
from hyper_parallel.parallel.tp_local import parallelize_mlp_local

# d_out=6 on purpose: the head does not split evenly over 4 ranks (chunks 2, 2, 2, 0), so padding
# and an empty local shard are exercised.
CONFIG = MLPConfig(d_in=16, d_model=32, hidden=64, d_out=6, n_blocks=2, seq_len=8)
GLOBAL_BATCH = 8
LR = 0.1
STEPS = 2
NUM_EXPERTS = 4

CASES: dict[str, tuple[int, Callable]] = {}


def case(name: str, world_size: int):
    """Register a case that runs in the launch with ``world_size`` ranks."""

    def register(fn):
        CASES[name] = (world_size, fn)
        return fn

    return register


# --------------------------------------------------------------------------- helpers


class Result:
    """What one case reports (JSON-serialisable)."""

    def __init__(self, tolerances: dict[str, list[float]], run_dir: Path) -> None:
        self.tolerances = tolerances
        self.run_dir = run_dir  # for files a case writes (removed again by the case)
        self.numbers: dict[str, dict] = {}
        self.facts: dict = {}

    def compare(
        self, label: str, actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], tol: str = "fp32"
    ) -> None:
        rtol, atol = self.tolerances[tol]
        per = {}
        for name, want in expected.items():
            got = actual[name].detach().float()
            want = want.detach().float()
            if got.shape != want.shape:
                per[name] = {
                    "max_abs": float("inf"),
                    "ratio": float("inf"),
                    "shape": [list(got.shape), list(want.shape)],
                }
                continue
            diff = (got - want).abs()
            per[name] = {
                "max_abs": diff.max().item() if diff.numel() else 0.0,
                "ratio": (diff / (atol + rtol * want.abs())).max().item() if diff.numel() else 0.0,
                "max_ref": want.abs().max().item() if want.numel() else 0.0,
                "rel_l2": ((got - want).norm() / want.norm().clamp_min(1e-30)).item(),
            }
        worst = max(per, key=lambda n: per[n]["ratio"])
        self.numbers[label] = {
            "tol": tol,
            "rtol": rtol,
            "atol": atol,
            "per": per,
            "worst": worst,
            "max_abs": max(v["max_abs"] for v in per.values()),
            "rel_l2": max(v.get("rel_l2", float("inf")) for v in per.values()),
            "ratio": max(v["ratio"] for v in per.values()),
        }


def rank() -> int:
    return dist.get_rank()


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The full tensor (a collective for DTensors: every rank must call it)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: full(p.grad) for n, p in model.named_parameters()}


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: full(p) for n, p in model.named_parameters()}


def local_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.to_local() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()}


def global_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean over all ranks (untraced bookkeeping). Correct for the global loss when every data slice
    is held by the same number of ranks, which holds for every layout below."""
    total = value.detach().double().reshape(1).clone()
    dist.all_reduce(total)
    return (total / dist.get_world_size()).float().reshape(())


def rows(tensor: torch.Tensor, index: int, count: int) -> torch.Tensor:
    """Slice ``index`` of ``count`` equal slices of the global batch."""
    size = tensor.shape[0] // count
    return tensor[index * size : (index + 1) * size]


def batch(seed: int, index: int, count: int):
    """(local x, local y, global x, global y) for data-parallel slice ``index`` of ``count``."""
    x, y = mlp_batch(CONFIG, GLOBAL_BATCH, seed)
    return rows(x, index, count), rows(y, index, count), x, y


def placements_str(placements) -> str:
    return "(" + ", ".join(str(p) for p in placements) + ")"


def group_dict(info) -> dict:
    return {"name": info.name, "ranks": list(info.ranks), "size": info.size}


def param_facts(model: nn.Module) -> dict:
    """GroupInfo, sizes and layout of every managed parameter, right after fully_shard."""
    facts = {}
    for name, p in model.named_parameters():
        entry = {"type": type(p).__name__, "shape": list(p.shape)}
        if isinstance(p, DTensor):
            entry.update(
                mesh_dims=list(p.device_mesh.mesh_dim_names),
                placements=placements_str(p.placements),
                local_shape=list(p.to_local().shape),
            )
        if hasattr(p, "sharded_group_info"):
            entry.update(
                shard_size=p.shard_size,
                dp_size=p.dp_size,
                rank_size=p.rank_size,
                sharded=group_dict(p.sharded_group_info),
                unsharded=group_dict(p.unsharded_group_info),
            )
        facts[name] = entry
    return facts


def apply_ours(model: nn.Module, mesh, **kwargs) -> nn.Module:
    """fully_shard bottom-up: each block, then the root (as FSDP2)."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


def apply_torch(model: nn.Module, mesh, **kwargs) -> nn.Module:
    for block in model.blocks:
        torch_fully_shard(block, mesh=mesh, **kwargs)
    return torch_fully_shard(model, mesh=mesh, **kwargs)


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), target)


def train_side_by_side(
    res: Result,
    models: dict[str, nn.Module],
    reference: nn.Module,
    local,
    global_,
    comparisons: list[tuple[str, str, str]],
    steps: int = STEPS,
    on_step: Callable[[int], None] | None = None,
    on_backward: Callable[[int], None] | None = None,
) -> None:
    """Train every model in ``models`` on this rank's batch and ``reference`` (key "ref") on the
    global batch for ``steps`` SGD steps; compare loss, grads (before each step) and params (after
    each step) for each (a, b, tolerance) in ``comparisons``. Only ``models["ours"]`` is traced
    (torch's FSDP2 does not call our recorder). ``on_backward(step)`` runs before the optimizer
    step, ``on_step(step)`` after it."""
    x, y = local
    gx, gy = global_
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=LR) for k, m in models.items()}
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    for step in range(steps):
        trace.set_step(step)
        losses, grads = {}, {}
        for key, model in models.items():
            loss = mse(model(x), y)
            loss.backward()
            trace.set_phase("other")
            losses[key] = global_mean(loss)
            grads[key] = full_grads(model)
        ref_loss = mse(reference(gx), gy)
        ref_loss.backward()
        losses["ref"] = ref_loss.detach().reshape(())
        grads["ref"] = {n: p.grad.detach().clone() for n, p in reference.named_parameters()}
        for a, b, tol in comparisons:
            res.compare(f"loss{step}:{a}-{b}", {"loss": losses[a]}, {"loss": losses[b]}, tol)
            res.compare(f"grad{step}:{a}-{b}", grads[a], grads[b], tol)
        if on_backward is not None:
            on_backward(step)
        trace.set_phase("optimizer")
        for opt in list(optimizers.values()) + [ref_opt]:
            opt.step()
            opt.zero_grad()
        trace.set_phase("other")
        params = {k: full_params(m) for k, m in models.items()}
        params["ref"] = {n: p.detach().clone() for n, p in reference.named_parameters()}
        for a, b, tol in comparisons:
            res.compare(f"param{step}:{a}-{b}", params[a], params[b], tol)
        if on_step is not None:
            on_step(step)


def new_mlp(seed: int) -> MLP:
    torch.manual_seed(seed)
    return MLP(CONFIG)


def tp_plan() -> dict:
    return {"w1": ColwiseParallel(), "w2": RowwiseParallel()}


def replica_spread(model: nn.Module, tp_mesh) -> dict[str, float]:
    """Largest difference between the tp replicas of each tp-Replicate parameter (untraced)."""
    group, size = tp_mesh.get_group(), tp_mesh.size()
    spread = {}
    for name, p in model.named_parameters():
        placements = dict(zip(p.device_mesh.mesh_dim_names, p.placements)) if isinstance(p, DTensor) else {}
        if not isinstance(placements.get("tp", Replicate()), Replicate):
            continue
        local = (p.to_local() if isinstance(p, DTensor) else p).detach().contiguous()
        gathered = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(gathered, local, group=group)
        spread[name] = max(((g - gathered[0]).abs().max().item() if g.numel() else 0.0) for g in gathered)
    return spread


# --------------------------------------------------------------------------- cases, 4 ranks


@case("c1_fsdp", 4)
def fsdp_1d(res: Result) -> None:
    """Case 1, FSDP 1-D over 4 ranks (``mesh=views["fsdp"]``, the torch FSDP2 call unchanged): RS only,
    equal to the reference and to torch FSDP2."""
    dims = ParallelDims(world_size=4)
    views = build_mesh(dims, "cpu")
    model = new_mlp(1)
    reference, theirs = copy.deepcopy(model), copy.deepcopy(model)
    apply_ours(model, views["fsdp"])
    apply_torch(theirs, views["fsdp"])
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(11, dims.coordinates(rank())["dp"], dims.dp)
    train_side_by_side(
        res,
        {"ours": model, "torch": theirs},
        reference,
        local,
        (gx, gy),
        [("ours", "ref", "fp32"), ("torch", "ref", "fp32"), ("ours", "torch", "fp32")],
    )


@case("c2_hsdp", 4)
def hsdp(res: Result) -> None:
    """Case 2, HSDP on (dp_replicate=2, fsdp=2): RS on fsdp + AR on dp_replicate; equal to the
    reference and to torch FSDP2 on the same 2-D mesh."""
    dims = ParallelDims(world_size=4, dp_replicate=2, dp_shard=2)
    views = build_mesh(dims, "cpu")
    model = new_mlp(2)
    reference, theirs = copy.deepcopy(model), copy.deepcopy(model)
    apply_ours(model, views["dp_replicate", "fsdp"])
    apply_torch(theirs, views["dp_replicate", "fsdp"])
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(12, dims.coordinates(rank())["dp"], dims.dp)
    train_side_by_side(
        res,
        {"ours": model, "torch": theirs},
        reference,
        local,
        (gx, gy),
        [("ours", "ref", "fp32"), ("torch", "ref", "fp32"), ("ours", "torch", "fp32")],
    )


def _pure_tp(res: Result, mark_partial_grads: bool, seed: int) -> None:
    dims = ParallelDims(world_size=4, dp_shard=2, tp=2)
    views = build_mesh(dims, "cpu")
    model = new_mlp(seed)
    reference = copy.deepcopy(model)
    model = parallelize_mlp_local(model, views["tp"], mark_partial_grads=mark_partial_grads)
    apply_ours(model, views["dp_replicate", "fsdp"], enable_param_shard=False)
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(13, dims.coordinates(rank())["dp"], dims.dp)
    res.facts["replica_spread"] = {}

    def spread(step: int) -> None:
        res.facts["replica_spread"][str(step)] = replica_spread(model, views["tp"])

    train_side_by_side(res, {"ours": model}, reference, local, (gx, gy), [("ours", "ref", "fp32")], on_step=spread)


@case("c5_pure_tp_fixed", 4)
def pure_tp_fixed(res: Result) -> None:
    """Case 5 with the fix: local-tensor TP+SP (tp=2) + fully_shard(enable_param_shard=False) on
    (dp_replicate=1, fsdp=2): AR of whole gradients on the unsharded dp group, no RS / AG by
    fully_shard; norm / w2 bias gradients summed over tp; equal to the reference, tp replicas equal."""
    _pure_tp(res, mark_partial_grads=True, seed=5)


@case("c5_pure_tp_unfixed", 4)
def pure_tp_unfixed(res: Result) -> None:
    """The pure-TP bug, same setup without marking partial gradients: the norm weight and w2 bias
    gradients stay partial over tp (wrong), and the tp replicas of those weights drift apart."""
    _pure_tp(res, mark_partial_grads=False, seed=5)


def _local_tp(res: Result, dims: ParallelDims, seed: int, mesh_dims: tuple[str, ...], **kwargs) -> None:
    """Local-tensor TP+SP over views["tp"] (partial grads marked), then fully_shard on views[mesh_dims]
    for every unit, the root included (its inp / head weights are plain tensors)."""
    views = build_mesh(dims, "cpu")
    model = new_mlp(seed)
    reference = copy.deepcopy(model)
    model = parallelize_mlp_local(model, views["tp"], mark_partial_grads=True)
    apply_ours(model, views[mesh_dims], **kwargs)
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(seed + 10, dims.coordinates(rank())["dp"], dims.dp)
    train_side_by_side(res, {"ours": model}, reference, local, (gx, gy), [("ours", "ref", "fp32")])


@case("c6_tp_only", 4)
def tp_only_mesh(res: Result) -> None:
    """Case 6a, pure TP over 4 ranks, every unit with ``mesh=views["tp"]`` and enable_param_shard=None:
    no data-parallel dim, so sharding is disabled by inference (shard 1, dp 1, rank 1); the only
    fully_shard collective is the partial-gradient AR over tp; equal to the reference."""
    _local_tp(res, ParallelDims(world_size=4, tp=4), 6, ("tp",))


@case("c6_dp_replicate_tp", 4)
def dp_replicate_tp_mesh(res: Result) -> None:
    """Case 6b, mesh (dp_replicate=2, tp=2) with enable_param_shard=None: no shard dim, so no
    sharding (shard 1, dp 2, rank 2): AR on dp_replicate only (+ the partial-gradient AR over tp)."""
    _local_tp(res, ParallelDims(world_size=4, dp_replicate=2, tp=2), 7, ("dp_replicate", "tp"))


@case("c7_full_mesh_4", 4)
def full_mesh_4(res: Result) -> None:
    """Case 7 on 4 ranks: the layout of case 5 (fsdp=2, tp=2), but the FULL mesh (dp_replicate, fsdp,
    tp) with enable_param_shard=None: not mistaken for pure TP, sharding stays on (RS over fsdp)."""
    _local_tp(res, ParallelDims(world_size=4, dp_shard=2, tp=2), 8, ("dp_replicate", "fsdp", "tp"))


@case("rebuilt_mesh", 4)
def rebuilt_mesh(res: Result) -> None:
    """Regression (bug found by this suite): build the same ParallelDims views twice in one process,
    run the same DTensor ops on the first build, then TP + fully_shard on the second build. DTensor's
    sharding-propagation cache hands the second build's TP parameters the first build's (value-equal)
    tp mesh object; fully_shard used to compare root meshes with ``is`` and raised "... do not share
    a root mesh". Must train like any other build."""
    dims = ParallelDims(world_size=4, dp_shard=2, tp=2)
    first = build_mesh(dims, "cpu")
    parallelize_mlp_local(new_mlp(40), first["tp"], mark_partial_grads=True)  # DTensor ops on build 1
    views = build_mesh(dims, "cpu")
    model = new_mlp(40)
    reference = copy.deepcopy(model)
    model = parallelize_mlp_local(model, views["tp"], mark_partial_grads=True)
    res.facts["tp_param_mesh_is_second_build"] = model.blocks[0].w1.weight.device_mesh is views["tp"]
    apply_ours(model, views["dp_replicate", "fsdp"], enable_param_shard=False)
    *local, gx, gy = batch(41, dims.coordinates(rank())["dp"], dims.dp)
    train_side_by_side(res, {"ours": model}, reference, local, (gx, gy), [("ours", "ref", "fp32")], steps=1)


@case("c8_mixed_precision", 4)
def mixed_precision(res: Result) -> None:
    """Case 8, FSDP 1-D with param_dtype=bf16, reduce_dtype=fp32, ours next to torch FSDP2 with the
    same policy: AG in bf16, RS in fp32; ours == torch tightly, ours ~ fp32 reference (bf16 bound)."""
    dims = ParallelDims(world_size=4)
    views = build_mesh(dims, "cpu")
    model = new_mlp(9)
    reference, theirs = copy.deepcopy(model), copy.deepcopy(model)
    apply_ours(
        model, views["fsdp"], mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    )
    apply_torch(
        theirs,
        views["fsdp"],
        mp_policy=TorchMixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    )
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(19, dims.coordinates(rank())["dp"], dims.dp)
    res.facts["dtypes"] = {}

    def dtypes(step: int) -> None:  # sharded params and their reduced grads stay fp32
        res.facts["dtypes"][str(step)] = {
            "params": sorted({str(p.dtype) for p in model.parameters()}),
            "grads": sorted({str(p.grad.dtype) for p in model.parameters()}),
        }

    train_side_by_side(
        res,
        {"ours": model, "torch": theirs},
        reference,
        local,
        (gx, gy),
        [("ours", "torch", "bf16_torch"), ("ours", "ref", "bf16_ref"), ("torch", "ref", "bf16_ref")],
        on_backward=dtypes,
    )


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
    x, y, gx, gy = batch(seed + 10, dims.coordinates(rank())["dp"], dims.dp)
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


@case("c9_accumulation_fsdp", 4)
def accumulation_fsdp(res: Result) -> None:
    """Case 9a, FSDP 1-D: set_requires_gradient_sync(False) on the first micro-batch (no RS), True
    on the second (RS of the accumulated sum) == one step on the whole global batch."""

    def skip(model, first):
        model.set_requires_gradient_sync(not first)

    _accumulate(res, ParallelDims(world_size=4), ("fsdp",), 21, skip)


@case("c9_accumulation_hsdp", 4)
def accumulation_hsdp(res: Result) -> None:
    """Case 9b, HSDP (2 x 2): set_requires_all_reduce(False) on the first micro-batch (RS but no AR),
    True on the second (RS + AR of the sum) == one step on the whole global batch."""

    def skip(model, first):
        model.set_requires_all_reduce(not first)

    _accumulate(res, ParallelDims(world_size=4, dp_replicate=2, dp_shard=2), ("dp_replicate", "fsdp"), 22, skip)


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
    index = dims.coordinates(rank())["dp"]
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


@case("c9_accumulation_unused_fsdp", 4)
def accumulation_unused_fsdp(res: Result) -> None:
    """Case 9c: FSDP, sync off for micro-batch 0, on for micro-batch 1; head 0 is not used in 1."""

    def skip(model, first):
        model.set_requires_gradient_sync(not first)

    _accumulate_unused(res, ParallelDims(world_size=4), ("fsdp",), skip)


@case("c9_accumulation_unused_hsdp", 4)
def accumulation_unused_hsdp(res: Result) -> None:
    """Case 9d: HSDP, all-reduce off for micro-batch 0, on for 1; head 0 is not used in 1."""

    def skip(model, first):
        model.set_requires_all_reduce(not first)

    _accumulate_unused(res, ParallelDims(world_size=4, dp_replicate=2, dp_shard=2), ("dp_replicate", "fsdp"), skip)


@case("c10_state_dict", 4)
def state_dict_round_trip(res: Result) -> None:
    """Case 10, FSDP 1-D (uneven head: rank 3 holds empty shards). After one step of model A:
    (a) sharded: local shards saved with torch.save, loaded with torch.load(weights_only=True) into a
    freshly built, differently initialised fully_shard model B -> identical local shards;
    (b) full: get_full_state_dict(A) == the reference's parameters; load_full_state_dict into fresh C
    -> identical local shards; (c) the DTensor state dict loaded in memory into fresh D; A, B, C, D
    take one more step: identical losses and parameters; (d) torch.save(A.state_dict()) itself."""
    dims = ParallelDims(world_size=4)
    views = build_mesh(dims, "cpu")
    mesh = views["fsdp"]
    model_a = new_mlp(30)
    reference = copy.deepcopy(model_a)
    apply_ours(model_a, mesh)
    res.facts["params"] = param_facts(model_a)
    index = dims.coordinates(rank())["dp"]
    local0, local1 = batch(31, index, dims.dp), batch(32, index, dims.dp)
    train_side_by_side(res, {"ours": model_a}, reference, local0[:2], local0[2:], [("ours", "ref", "fp32")], steps=1)

    trace.set_step(100)  # state-dict traffic: fully_shard issues no traced collectives here
    state = model_a.state_dict()
    res.facts["state_dict_types"] = sorted({type(v).__name__ for v in state.values()})
    res.facts["state_dict_placements"] = {
        k: placements_str(v.placements) for k, v in state.items() if isinstance(v, DTensor)
    }
    path = res.run_dir / f"fully_shard_c10_rank{rank()}.pt"
    torch.save({k: v.to_local() for k, v in state.items()}, path)
    loaded = torch.load(path, weights_only=True)
    model_b = apply_ours(new_mlp(33), mesh)
    like = model_b.state_dict()
    model_b.load_state_dict(
        {
            k: DTensor.from_local(
                loaded[k],
                like[k].device_mesh,
                like[k].placements,
                run_check=False,
                shape=like[k].shape,
                stride=like[k].stride(),
            )
            for k in like
        }
    )
    # (d) the DTensor state dict itself through a file: torch.save(model.state_dict()) as users write it
    model_e = apply_ours(new_mlp(36), mesh)
    res.facts["file_local_equal"] = {}
    try:
        torch.save(state, path)
        model_e.load_state_dict(torch.load(path, weights_only=True))
        res.facts["dtensor_file_round_trip"] = "ok"
    except Exception as exc:  # recorded; see the test's xfail
        res.facts["dtensor_file_round_trip"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    else:
        got = local_params(model_e)
        res.facts["file_local_equal"] = {n: bool(torch.equal(got[n], t)) for n, t in local_params(model_a).items()}
    full_state = get_full_state_dict(model_a)
    res.compare("full_state:ours-ref", full_state, dict(reference.named_parameters()))
    model_c = apply_ours(new_mlp(34), mesh)
    load_full_state_dict(model_c, full_state)
    model_d = apply_ours(new_mlp(35), mesh)  # in-memory DTensor state dict round trip
    model_d.load_state_dict(state)
    ref_local = local_params(model_a)
    for key, other in (("sharded", model_b), ("full", model_c), ("in_memory", model_d)):
        got = local_params(other)
        res.facts[f"{key}_local_equal"] = {n: bool(torch.equal(got[n], ref_local[n])) for n in ref_local}
        res.facts[f"{key}_local_shapes"] = {n: list(got[n].shape) for n in ref_local}
    res.facts["local_shapes"] = {n: list(t.shape) for n, t in ref_local.items()}

    trace.set_step(1)
    x, y, gx, gy = local1
    losses, params = {}, {}
    for key, model in (("A", model_a), ("B", model_b), ("C", model_c), ("D", model_d)):
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        loss = mse(model(x), y)
        loss.backward()
        trace.set_phase("optimizer")
        optimizer.step()
        trace.set_phase("other")
        losses[key] = loss.item()
        params[key] = local_params(model)
    ref_loss = mse(reference(gx), gy)
    res.facts["next_step_losses"] = losses
    res.facts["next_step_params_equal"] = {
        k: all(torch.equal(params[k][n], params["A"][n]) for n in params["A"]) for k in params
    }
    res.compare("next_loss:ours-ref", {"loss": global_mean(torch.tensor(losses["A"]))}, {"loss": ref_loss.detach()})
    path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- cases, 8 ranks


@case("c3_dp_tp", 8)
def dp_tp(res: Result) -> None:
    """Case 3, (dp_replicate=2, fsdp=2, tp=2): torch TP (ColwiseParallel w1, RowwiseParallel w2) then
    fully_shard on (dp_replicate, fsdp). In forward the TP placement stays (w1 is a DTensor on tp with
    Shard(0)); backward: RS on fsdp + AR on dp_replicate. Equal to the reference and to torch FSDP2+TP."""
    dims = ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, tp=2)
    views = build_mesh(dims, "cpu")
    model = new_mlp(3)
    reference, theirs = copy.deepcopy(model), copy.deepcopy(model)
    for m in (model, theirs):
        for block in m.blocks:
            parallelize_module(block, views["tp"], tp_plan())
    apply_ours(model, views["dp_replicate", "fsdp"])
    apply_torch(theirs, views["dp_replicate", "fsdp"])
    res.facts["params"] = param_facts(model)
    res.facts["forward_w1"] = {}

    def seen(module, args):
        w = module.weight
        res.facts["forward_w1"][str(len(res.facts["forward_w1"]))] = {
            "type": type(w).__name__,
            "mesh_dims": list(w.device_mesh.mesh_dim_names) if isinstance(w, DTensor) else [],
            "placements": placements_str(w.placements) if isinstance(w, DTensor) else "",
            "local_shape": list((w.to_local() if isinstance(w, DTensor) else w).shape),
        }

    model.blocks[0].w1.register_forward_pre_hook(seen)
    *local, gx, gy = batch(14, dims.coordinates(rank())["dp"], dims.dp)
    train_side_by_side(
        res,
        {"ours": model, "torch": theirs},
        reference,
        local,
        (gx, gy),
        [("ours", "ref", "fp32"), ("torch", "ref", "fp32"), ("ours", "torch", "fp32")],
    )


class Experts(nn.Module):
    """``num_experts`` linear experts ``[E, d, d]``; every token goes through every expert, outputs are
    averaged (a fixed uniform gate keeps the test about layouts, not routing). With a DTensor weight
    on (ep, etp) = (Shard(0), Shard(2)) the forward runs on DTensor ops: the replicated tokens meet
    this rank's experts' output columns, ``full_tensor()`` gathers the result."""

    def __init__(self, num_experts: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_experts, dim, dim) * dim**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        tokens = x.reshape(1, -1, x.shape[-1]).expand(weight.shape[0], -1, -1)
        if isinstance(weight, DTensor):
            tokens = DTensor.from_local(
                tokens, weight.device_mesh, [Replicate()] * weight.device_mesh.ndim, run_check=False
            )
            out = torch.bmm(tokens, weight).full_tensor()
        else:
            out = torch.bmm(tokens, weight)
        return out.mean(0).reshape(x.shape[:-1] + (weight.shape[-1],))


class DenseAndExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(CONFIG.d_in, CONFIG.d_model)
        self.block = MLPBlock(CONFIG.d_model, CONFIG.hidden)
        self.experts = Experts(NUM_EXPERTS, CONFIG.d_model)
        self.head = nn.Linear(CONFIG.d_model, CONFIG.d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.experts(self.block(self.inp(x))))


@case("c4_dp_tp_ep", 8)
def dp_tp_ep(res: Result) -> None:
    """Case 4, ParallelDims(8, dp_shard=4, tp=2, ep=2, etp=2) -> sparse (dp_replicate 1, efsdp 2, ep 2,
    etp 2). Dense block: torch TP on tp + fully_shard on (dp_replicate, fsdp=4); experts [4, 32, 32]:
    a DTensor (Shard(0), Shard(2)) on (ep, etp) + fully_shard on (dp_replicate, efsdp). Unshard
    gathers only the efsdp dim: ep / etp placements identical before and after. The ranks of one
    ep x etp group share data (efsdp index = data slice), so DTensor ops compute exact gradients."""
    dims = ParallelDims(world_size=8, dp_shard=4, tp=2, ep=2, etp=2)
    views = build_mesh(dims, "cpu")
    torch.manual_seed(4)
    model = DenseAndExperts()
    reference = copy.deepcopy(model)
    parallelize_module(model.block, views["tp"], tp_plan())
    model.experts.weight = nn.Parameter(
        distribute_tensor(
            model.experts.weight.detach(), views.sparse["ep", "etp"], [Shard(0), Shard(2)], src_data_rank=None
        )
    )
    fully_shard(model.block, mesh=views["dp_replicate", "fsdp"])
    fully_shard(model.experts, mesh=views.sparse["dp_replicate", "efsdp"])
    fully_shard(model, mesh=views["dp_replicate", "fsdp"])
    res.facts["params"] = param_facts(model)
    coords = dims.coordinates(rank())
    res.facts["efsdp_index"] = coords["efsdp"]
    *local, gx, gy = batch(15, coords["efsdp"], dims.efsdp * dims.dp_replicate)
    train_side_by_side(res, {"ours": model}, reference, local, (gx, gy), [("ours", "ref", "fp32")])


@case("c7_full_mesh", 8)
def full_mesh(res: Result) -> None:
    """Case 7, local-tensor TP on (dp_replicate=2, fsdp=2, tp=2) and fully_shard on the FULL mesh
    (dp_replicate, fsdp, tp) with enable_param_shard=None: the tp dim does not make it "pure TP";
    sharding stays on: RS on fsdp + AR on dp_replicate (+ partial AR over tp); equal to the reference."""
    _local_tp(res, ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, tp=2), 10, ("dp_replicate", "fsdp", "tp"))


# --------------------------------------------------------------------------- driver

COLLECTIVE_KEYS = ("op", "group", "ranks", "bytes", "dtype", "phase", "module", "step")
PLACEMENT_KEYS = ("param", "mesh_dims", "before", "after", "local_shape", "global_shape", "phase", "step")


def clear_dtensor_caches() -> None:
    """Forget DTensor's cached sharding propagations (C++ fast path and Python lru_cache).

    Keeps the cases independent: those caches key on DeviceMesh *equality*, so without this a DTensor
    op on a freshly built but value-equal mesh returns a spec carrying an earlier case's mesh object
    (case ``rebuilt_mesh`` creates that situation on purpose)."""
    torch._C._clear_DTensor_sharding_propagator_cache()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()


def run_case(name: str, fn: Callable, tolerances: dict, run_dir: Path) -> dict:
    res = Result(tolerances, run_dir)
    clear_dtensor_caches()
    start = time.perf_counter()
    error = None
    with trace.record() as recorder:
        try:
            fn(res)
        except Exception:  # recorded per case; the other cases still run
            error = traceback.format_exc()
    events = recorder.events
    dist.barrier()
    return {
        "ok": error is None,
        "error": error,
        "seconds": time.perf_counter() - start,
        "doc": (fn.__doc__ or "").strip(),
        "numbers": res.numbers,
        "facts": res.facts,
        "collectives": [{k: e[k] for k in COLLECTIVE_KEYS} for e in events if e["kind"] == "collective"],
        "placements": [{k: e[k] for k in PLACEMENT_KEYS} for e in events if e["kind"] == "placement"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="all", help="comma-separated case names, or 'all' (for this world size)")
    parser.add_argument(
        "--tolerances", required=True, help='JSON {"fp32": [rtol, atol], "bf16_torch": ..., "bf16_ref": ...}'
    )
    parser.add_argument("--out", default=os.environ.get("HYPER_PARALLEL_RUN_DIR", "."))
    parser.add_argument("--collective-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    tolerances = json.loads(args.tolerances)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.collective_timeout))
    world = dist.get_world_size()
    names = [n for n, (w, _) in CASES.items() if w == world] if args.cases == "all" else args.cases.split(",")
    unknown = [n for n in names if n not in CASES or CASES[n][0] != world]
    if unknown:
        raise SystemExit(f"unknown cases for world size {world}: {unknown}; known: {sorted(CASES)}")
    out = Path(args.out)
    results = {}
    try:
        for name in names:
            results[name] = run_case(name, CASES[name][1], tolerances, out)
            if rank() == 0:
                status = "ok" if results[name]["ok"] else "FAILED"
                print(f"[case] {name} {status} {results[name]['seconds']:.2f}s", flush=True)
            if not results[name]["ok"]:
                print(f"[case] {name} rank {rank()}:\n{results[name]['error']}", flush=True)
        (out / f"fully_shard_rank{rank()}.json").write_text(
            json.dumps({"rank": rank(), "world_size": world, "cases": results})
        )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
