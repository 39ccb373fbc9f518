"""Cases 3 and 4 of the fully_shard test matrix (docs/design.md §3), on 8 ranks: torch's DTensor TP
(ColwiseParallel / RowwiseParallel) under ``fully_shard`` on (dp_replicate=2, fsdp=2), trained side by side
with the single-process reference and torch FSDP2 + TP; a dense block next to experts that are
DTensors on (ep, etp) and sharded on efsdp, trained next to the reference; and gradient clipping over the
two meshes of TP + fully_shard (checked by tests/test_fully_shard_tp.py).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from fully_shard_training import (
    CONFIG,
    NUM_EXPERTS,
    Result,
    apply_ours,
    apply_torch,
    batch,
    case,
    full_grads,
    mse,
    new_mlp,
    param_facts,
    placements_str,
    rank,
    tp_plan,
    train_side_by_side,
)
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import parallelize_module

from hyper_parallel.fsdp import clip_grad_norm_, fully_shard
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh
from hyper_parallel.models.mlp import MLPBlock


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
            parallelize_module(block, views[MeshDim.TP], tp_plan())
    apply_ours(model, views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    apply_torch(theirs, views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
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
    *local, gx, gy = batch(14, dims.coordinates(rank())[MeshDim.DP], dims.dp)
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
    parallelize_module(model.block, views[MeshDim.TP], tp_plan())
    model.experts.weight = nn.Parameter(
        distribute_tensor(
            model.experts.weight.detach(),
            views.sparse[MeshDim.EP, MeshDim.ETP],
            [Shard(0), Shard(2)],
            src_data_rank=None,
        )
    )
    fully_shard(model.block, mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    fully_shard(model.experts, mesh=views.sparse[MeshDim.DP_REPLICATE, MeshDim.EFSDP])
    fully_shard(model, mesh=views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    res.facts["params"] = param_facts(model)
    coords = dims.coordinates(rank())
    res.facts["efsdp_index"] = coords[MeshDim.EFSDP]
    *local, gx, gy = batch(15, coords[MeshDim.EFSDP], dims.efsdp * dims.dp_replicate)
    train_side_by_side(res, {"ours": model}, reference, local, (gx, gy), [("ours", "ref", "fp32")])


@case("clip_grad_norm_over_two_meshes", 8)
def clip_over_two_meshes(res: Result) -> None:
    """(dp_replicate=2, fsdp=2, tp=2) as case 3: the blocks' gradients are DTensors on (dp_replicate, fsdp, tp),
    the root's on (dp_replicate, fsdp). torch's clip_grad_norm_ refuses to stack norms of two meshes;
    ours returns the single-process model's total norm and leaves the same clipped gradients (2-norm and
    inf-norm, max_norm half the total so the clipping scales)."""
    dims = ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, tp=2)
    views = build_mesh(dims, "cpu")
    model = new_mlp(5)
    reference = copy.deepcopy(model)
    for block in model.blocks:
        parallelize_module(block, views[MeshDim.TP], tp_plan())
    apply_ours(model, views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    x, y, gx, gy = batch(16, dims.coordinates(rank())[MeshDim.DP], dims.dp)
    mse(model(x), y).backward()
    mse(reference(gx), gy).backward()
    meshes = {p.grad.device_mesh.mesh_dim_names for p in model.parameters() if isinstance(p.grad, DTensor)}
    res.facts["grad_meshes"] = sorted(list(m) for m in meshes)
    try:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        res.facts["torch_clip"] = "ran"
    except RuntimeError as error:
        res.facts["torch_clip"] = str(error).splitlines()[0]
    for norm_type in (2.0, float("inf")):
        whole = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()], norm_type)
        max_norm = whole.item() / 2
        ours = clip_grad_norm_(model.parameters(), max_norm, norm_type)
        theirs = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm, norm_type)
        label = "2" if norm_type == 2.0 else "inf"
        res.compare(f"norm_{label}:ours-ref", {"norm": ours}, {"norm": theirs})
        res.compare(
            f"clipped_{label}:ours-ref",
            full_grads(model),
            {n: p.grad for n, p in reference.named_parameters()},
        )
