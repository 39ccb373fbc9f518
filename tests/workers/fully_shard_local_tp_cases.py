"""Cases 5, 6 and 7 of the fully_shard test matrix (docs/design.md §3) and the rebuilt-mesh regression:
local-tensor TP+SP (``parallelize_mlp_local``) under ``fully_shard`` with ``enable_param_shard`` False or
inferred (None) from the mesh -- pure TP (all-reduce only, partial gradients marked or not), a tp-only or
(dp_replicate, tp) mesh (no shard dim), and the full (dp_replicate, fsdp, tp) mesh on 4 and 8 ranks;
each trains side by side with the single-process reference (checked by tests/test_fully_shard_local_tp.py).
"""

from __future__ import annotations

import copy

from fully_shard_training import (
    Result,
    apply_ours,
    batch,
    case,
    new_mlp,
    param_facts,
    rank,
    replica_spread,
    train_side_by_side,
)

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh
from hyper_parallel.parallel.tp_local import parallelize_mlp_local


def _pure_tp(res: Result, mark_partial_grads: bool, seed: int) -> None:
    dims = ParallelDims(world_size=4, dp_shard=2, tp=2)
    views = build_mesh(dims, "cpu")
    model = new_mlp(seed)
    reference = copy.deepcopy(model)
    model = parallelize_mlp_local(model, views[MeshDim.TP], mark_partial_grads=mark_partial_grads)
    apply_ours(model, views[MeshDim.DP_REPLICATE, MeshDim.FSDP], enable_param_shard=False)
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(13, dims.coordinates(rank())[MeshDim.DP], dims.dp)
    res.facts["replica_spread"] = {}

    def spread(step: int) -> None:
        res.facts["replica_spread"][str(step)] = replica_spread(model, views[MeshDim.TP])

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
    model = parallelize_mlp_local(model, views[MeshDim.TP], mark_partial_grads=True)
    apply_ours(model, views[mesh_dims], **kwargs)
    res.facts["params"] = param_facts(model)
    *local, gx, gy = batch(seed + 10, dims.coordinates(rank())[MeshDim.DP], dims.dp)
    train_side_by_side(res, {"ours": model}, reference, local, (gx, gy), [("ours", "ref", "fp32")])


@case("c6_tp_only", 4)
def tp_only_mesh(res: Result) -> None:
    """Case 6a, pure TP over 4 ranks, every unit with ``mesh=views["tp"]`` and enable_param_shard=None:
    no data-parallel dim, so sharding is disabled by inference (shard 1, dp 1, rank 1); the only
    fully_shard collective is the partial-gradient AR over tp; equal to the reference."""
    _local_tp(res, ParallelDims(world_size=4, tp=4), 6, (MeshDim.TP,))


@case("c6_dp_replicate_tp", 4)
def dp_replicate_tp_mesh(res: Result) -> None:
    """Case 6b, mesh (dp_replicate=2, tp=2) with enable_param_shard=None: no shard dim, so no
    sharding (shard 1, dp 2, rank 2): AR on dp_replicate only (+ the partial-gradient AR over tp)."""
    _local_tp(res, ParallelDims(world_size=4, dp_replicate=2, tp=2), 7, (MeshDim.DP_REPLICATE, MeshDim.TP))


@case("c7_full_mesh_4", 4)
def full_mesh_4(res: Result) -> None:
    """Case 7 on 4 ranks: the layout of case 5 (fsdp=2, tp=2), but the FULL mesh (dp_replicate, fsdp,
    tp) with enable_param_shard=None: not mistaken for pure TP, sharding stays on (RS over fsdp)."""
    _local_tp(res, ParallelDims(world_size=4, dp_shard=2, tp=2), 8, (MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP))


@case("rebuilt_mesh", 4)
def rebuilt_mesh(res: Result) -> None:
    """Regression (bug found by this suite): build the same ParallelDims views twice in one process,
    run the same DTensor ops on the first build, then TP + fully_shard on the second build. DTensor's
    sharding-propagation cache hands the second build's TP parameters the first build's (value-equal)
    tp mesh object; fully_shard used to compare root meshes with ``is`` and raised "... do not share
    a root mesh". Must train like any other build."""
    dims = ParallelDims(world_size=4, dp_shard=2, tp=2)
    first = build_mesh(dims, "cpu")
    parallelize_mlp_local(new_mlp(40), first[MeshDim.TP], mark_partial_grads=True)  # DTensor ops on build 1
    views = build_mesh(dims, "cpu")
    model = new_mlp(40)
    reference = copy.deepcopy(model)
    model = parallelize_mlp_local(model, views[MeshDim.TP], mark_partial_grads=True)
    res.facts["tp_param_mesh_is_second_build"] = model.blocks[0].w1.weight.device_mesh is views[MeshDim.TP]
    apply_ours(model, views[MeshDim.DP_REPLICATE, MeshDim.FSDP], enable_param_shard=False)
    *local, gx, gy = batch(41, dims.coordinates(rank())[MeshDim.DP], dims.dp)
    train_side_by_side(res, {"ours": model}, reference, local, (gx, gy), [("ours", "ref", "fp32")], steps=1)


@case("c7_full_mesh", 8)
def full_mesh(res: Result) -> None:
    """Case 7, local-tensor TP on (dp_replicate=2, fsdp=2, tp=2) and fully_shard on the FULL mesh
    (dp_replicate, fsdp, tp) with enable_param_shard=None: the tp dim does not make it "pure TP";
    sharding stays on: RS on fsdp + AR on dp_replicate (+ partial AR over tp); equal to the reference."""
    _local_tp(
        res,
        ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, tp=2),
        10,
        (MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP),
    )
