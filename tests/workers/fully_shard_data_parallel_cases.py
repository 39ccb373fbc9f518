"""Cases 1, 2 and 8 of the fully_shard test matrix (docs/design.md §3), the data-parallel layouts with no
tensor parallelism: FSDP 1-D over 4 ranks, HSDP on (dp_replicate=2, fsdp=2), and FSDP 1-D under a bf16
MixedPrecisionPolicy; each trains our ``fully_shard`` side by side with the single-process reference and
torch's own FSDP2 under the same mesh and policy (checked by tests/test_fully_shard_data_parallel.py).
"""

from __future__ import annotations

import copy

import torch
from fully_shard_training import (
    Result,
    apply_ours,
    apply_torch,
    batch,
    case,
    new_mlp,
    param_facts,
    rank,
    train_side_by_side,
)
from torch.distributed.fsdp import MixedPrecisionPolicy as TorchMixedPrecisionPolicy

from hyper_parallel.fsdp import MixedPrecisionPolicy
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh


@case("c1_fsdp", 4)
def fsdp_1d(res: Result) -> None:
    """Case 1, FSDP 1-D over 4 ranks (``mesh=views["fsdp"]``, the torch FSDP2 call unchanged): RS only,
    equal to the reference and to torch FSDP2."""
    dims = ParallelDims(world_size=4)
    views = build_mesh(dims, "cpu")
    model = new_mlp(1)
    reference, theirs = copy.deepcopy(model), copy.deepcopy(model)
    apply_ours(model, views[MeshDim.FSDP])
    apply_torch(theirs, views[MeshDim.FSDP])
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(11, dims.coordinates(rank())[MeshDim.DP], dims.dp)
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
    apply_ours(model, views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    apply_torch(theirs, views[MeshDim.DP_REPLICATE, MeshDim.FSDP])
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(12, dims.coordinates(rank())[MeshDim.DP], dims.dp)
    train_side_by_side(
        res,
        {"ours": model, "torch": theirs},
        reference,
        local,
        (gx, gy),
        [("ours", "ref", "fp32"), ("torch", "ref", "fp32"), ("ours", "torch", "fp32")],
    )


@case("c8_mixed_precision", 4)
def mixed_precision(res: Result) -> None:
    """Case 8, FSDP 1-D with param_dtype=bf16, reduce_dtype=fp32, ours next to torch FSDP2 with the
    same policy: AG in bf16, RS in fp32; ours == torch tightly, ours ~ fp32 reference (bf16 bound)."""
    dims = ParallelDims(world_size=4)
    views = build_mesh(dims, "cpu")
    model = new_mlp(9)
    reference, theirs = copy.deepcopy(model), copy.deepcopy(model)
    apply_ours(
        model,
        views[MeshDim.FSDP],
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    )
    apply_torch(
        theirs,
        views[MeshDim.FSDP],
        mp_policy=TorchMixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    )
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(19, dims.coordinates(rank())[MeshDim.DP], dims.dp)
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
