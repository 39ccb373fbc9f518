"""What every case of the fully_shard test matrix (docs/design.md §3) shares, on the worker side: the
case registry, the tiny model and its batches, and the loop that trains our ``fully_shard`` next to an
unparallelized deepcopy on the global batch (the single-process reference) and, where asked, torch's own
``torch.distributed.fsdp.fully_shard`` (an independent oracle), recording per rank the largest difference
and tolerance ratio of every compared tensor (``Result.compare``) and the GroupInfo / layout of every
managed parameter (``param_facts``); each case lives in the tests/test_fully_shard_*.py file that asserts on
it, the launch in ``fully_shard_worker.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from hyper_parallel import trace
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch

# d_out=6 on purpose: the head does not split evenly over 4 ranks (chunks 2, 2, 2, 0), so padding
# and an empty local shard are exercised.
CONFIG = MLPConfig(d_in=16, d_model=32, hidden=64, d_out=6, n_blocks=2, seq_len=8)
GLOBAL_BATCH = 8
LR = 0.1
STEPS = 2
NUM_EXPERTS = 4

CASES: dict[str, tuple[int, Callable]] = {}
"""name -> (world size of the launch that runs it, case function); filled by the case modules on import."""


def case(name: str, world_size: int):
    """Register a case that runs in the launch with ``world_size`` ranks."""

    def register(fn):
        CASES[name] = (world_size, fn)
        return fn

    return register


# --------------------------------------------------------------------------- results, models, batches


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


def this_rank() -> int:
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


AGAINST_REFERENCE_AND_TORCH = [("ours", "ref", "fp32"), ("torch", "ref", "fp32"), ("ours", "torch", "fp32")]


def train_with_torch_fsdp2(
    res: Result,
    dims,
    ours: nn.Module,
    theirs: nn.Module,
    reference: nn.Module,
    data_seed: int,
    comparisons: list[tuple[str, str, str]] = AGAINST_REFERENCE_AND_TORCH,
    **kwargs,
) -> None:
    """``train_side_by_side`` of our model and torch FSDP2's on this rank's data-parallel slice of batch
    ``data_seed`` (``dims``: the run's ParallelDims), the reference on all of it."""
    *local, gx, gy = batch(data_seed, dims.coordinates(this_rank())[MeshDim.DP], dims.dp)
    train_side_by_side(res, {"ours": ours, "torch": theirs}, reference, local, (gx, gy), comparisons, **kwargs)


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
        if not isinstance(placements.get(MeshDim.TP, Replicate()), Replicate):
            continue
        local = (p.to_local() if isinstance(p, DTensor) else p).detach().contiguous()
        gathered = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(gathered, local, group=group)
        spread[name] = max(((g - gathered[0]).abs().max().item() if g.numel() else 0.0) for g in gathered)
    return spread
