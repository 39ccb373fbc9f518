"""Drop-in cases on meshes beyond 1-D FSDP, over 4 ranks: meshes without dim names (FSDP2's docs' own
``init_device_mesh("cpu", (4,))``, 1-D and 2-D), torch's TP plan on tp with fully_shard on
(dp_replicate, fsdp) of the same mesh (with sequence parallelism and tied weights too), torch's test MoE
with ExpertParallel on ep and the experts a unit on efsdp, and DCP checkpoints saved by ours and loaded by
torch FSDP2 on another mesh and back (checked by tests/test_drop_in.py: against torch FSDP2, the
single-process reference -- the MoE against the reference only, gloo lacks FSDP2's PREMUL_SUM -- and
parameter by parameter across the DCP round trip).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from drop_in_training import (
    case,
    fsdp_only,
    full,
    max_diff,
    run_three,
    shard_per_block,
    tokens,
    train,
    transformer,
    world_mesh,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.tensor.parallel import parallelize_module
from torch.testing._internal.distributed._tensor.common_dtensor import ExpertParallel, Transformer

from hyper_parallel.fsdp import fully_shard as our_fully_shard
from hyper_parallel.mesh_dims import MeshDim


def tp_case(shape: tuple[int, int, int], sequence_parallel: bool, tying: bool) -> dict:
    """TP on mesh["tp"] with torch's own plan, fully_shard on mesh["dp_replicate", "fsdp"]: slices of ONE mesh."""
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP))
    dp_mesh = mesh[MeshDim.DP_REPLICATE, MeshDim.FSDP]
    dp_size = shape[0] * shape[1]
    dp_rank = dp_mesh.get_coordinate()[0] * shape[1] + dp_mesh.get_coordinate()[1]

    def with_(shard):
        def apply(model):
            # local_output_for_attn: DTensor has no sharding rule for CPU's fused attention kernel
            Transformer.parallelize(
                model, mesh[MeshDim.TP], use_seq_parallel=sequence_parallel, local_output_for_attn=True
            )
            shard_per_block(model, shard, dp_mesh)
            return model

        return apply

    return run_three(
        lambda: transformer(weight_tying=tying),
        {"torch": with_(torch_fully_shard), "ours": with_(our_fully_shard)},
        dp_rank,
        dp_size,
    )


@case
def unnamed_mesh_1d():
    """fully_shard(block, mesh=init_device_mesh("cpu", (4,))), no dim names, as FSDP2's docs write it."""
    return run_three(
        lambda: transformer(weight_tying=False), fsdp_only(init_device_mesh("cpu", (4,))), dist.get_rank(), 4
    )


@case
def unnamed_mesh_2d():
    """An unnamed (2, 2) mesh, read by position as (replicate, shard). torch 2.13's fully_shard refuses an
    unnamed 2-D mesh (it asks for names), so its side runs on the same mesh named (dp_replicate, dp_shard)."""
    named = init_device_mesh("cpu", (2, 2), mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.DP_SHARD))
    unnamed = init_device_mesh("cpu", (2, 2))
    return run_three(
        lambda: transformer(weight_tying=False),
        {"torch": fsdp_only(named)["torch"], "ours": fsdp_only(unnamed)["ours"]},
        dist.get_rank(),
        4,
    )


@case
def mesh_2_1_2_tp():
    return tp_case((2, 1, 2), sequence_parallel=False, tying=False)


@case
def mesh_1_2_2_tied_tp_sp():
    return tp_case((1, 2, 2), sequence_parallel=True, tying=True)


@case
def moe_expert_parallel():
    """torch's test MoE: ExpertParallel on ep=2 (tokens all-gathered in, outputs reduce-scattered back), the
    experts a unit on efsdp=2 of the same 4 ranks, dense parts on fsdp=4. Each rank's expert gradient sums
    the tokens of its ep group, and the efsdp reduction those of the other group: 4 ranks' worth, so the
    experts divide by 4 (set_gradient_divide_factor), not by efsdp's 2. No FSDP2 oracle: its divide
    factor needs PREMUL_SUM, which gloo lacks."""
    sparse = init_device_mesh("cpu", (2, 2), mesh_dim_names=(MeshDim.EFSDP, MeshDim.EP))

    def apply(model):
        for layer in model.layers:
            experts = layer.expert_layer.experts
            parallelize_module(experts, sparse[MeshDim.EP], ExpertParallel())
            our_fully_shard(experts, mesh=sparse[MeshDim.EFSDP])
            experts.set_gradient_divide_factor(dist.get_world_size())
        shard_per_block(model, our_fully_shard, world_mesh())
        return model

    result = run_three(lambda: transformer(weight_tying=False, num_experts=4), {"ours": apply}, dist.get_rank(), 4)
    model = apply(transformer(weight_tying=False, num_experts=4))
    result["facts"] = {"expert_placements": [str(p) for p in model.layers[0].expert_layer.experts.w1.placements]}
    return result


def dcp_roundtrip(
    save_with: Callable, load_with: Callable, save_mesh: DeviceMesh, load_mesh: DeviceMesh, directory: Path
) -> dict:
    """Train 1 step with one implementation, save with DCP, load into the other on another mesh."""
    _, local = tokens(dist.get_rank(), 4)
    source = transformer(weight_tying=False)
    shard_per_block(source, save_with, save_mesh)
    train(source, local)
    expected = {n: full(p) for n, p in source.named_parameters()}
    if dist.get_rank() == 0:
        shutil.rmtree(directory, ignore_errors=True)
    dist.barrier()
    dcp.save(source.state_dict(), checkpoint_id=str(directory))
    target = transformer(weight_tying=False)
    shard_per_block(target, load_with, load_mesh)
    state = target.state_dict()
    dcp.load(state, checkpoint_id=str(directory))
    target.load_state_dict(state)
    loaded = {n: full(p) for n, p in target.named_parameters()}
    return {"max_abs": max_diff(loaded, expected)}


@case
def dcp_ours_to_torch_and_back():
    directory = Path(os.environ.get("DROP_IN_OUT", ".")) / "dcp"
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.FSDP))
    return {
        "ours_to_torch": dcp_roundtrip(our_fully_shard, torch_fully_shard, world_mesh(), hsdp, directory),
        "torch_to_ours": dcp_roundtrip(torch_fully_shard, our_fully_shard, hsdp, world_mesh(), directory),
    }
