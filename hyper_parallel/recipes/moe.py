"""MoE recipes S1-S3 on the mini transformer: EP (etp 1) or EP+ETP (etp == tp), dual-stack FSDP.

Order (TorchTitan): TP(+SP) -> EP/ETP -> CP -> fully_shard. Experts are one fully_shard unit on the
sparse view (dp_replicate, efsdp) — their ep/etp placements come from EP — and each block another
on the dense view (dp_replicate, fsdp). The experts' gradients are divided by dp_cp, the number of
data shards, like every dense gradient: each token of the global batch reaches its expert exactly
once over the ep group, so their sum over ep, efsdp and dp_replicate is the sum over all data shards.
"""

from __future__ import annotations

import copy
import dataclasses

from hyper_parallel.devices import seeded_on_host
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import MeshViews
from hyper_parallel.models.moe import MoE
from hyper_parallel.models.transformer import Transformer, TransformerConfig
from hyper_parallel.parallel.ep import parallelize_moe
from hyper_parallel.parallel.tp import parallelize_transformer_tp
from hyper_parallel.partial_grad import mark_partial
from hyper_parallel.recipes.options import RunOptions
from hyper_parallel.recipes.training import Workload
from hyper_parallel.recipes.transformer import apply_context_parallel, lm_workload

MOE_CONFIG = TransformerConfig(moe_layers=(1,), num_experts=4, top_k=2, moe_hidden=32, shared_expert=True)


def moe_layers(model: Transformer) -> list:
    return [layer for layer in model.layers if isinstance(layer.feed_forward, MoE)]


def apply_expert_parallel(model: Transformer, dims: ParallelDims, views: MeshViews, dispatch: str) -> None:
    """EP (etp 1) or EP+ETP on every MoE feed-forward. Under SP with etp == 1 the router and shared
    expert see only this rank's sequence shard: their gradients are partial over tp (marked). With ep == 1
    every expert stays whole on every rank (no dispatch), and under SP its gradients are partial over tp too."""
    for layer in moe_layers(model):
        moe = layer.feed_forward
        if dims.ep > 1:
            parallelize_moe(
                moe, views[MeshDim.EP, MeshDim.ETP] if dims.etp > 1 else views[MeshDim.EP], dispatch=dispatch
            )
        if dims.tp > 1 and dims.etp == 1:
            replicated = [moe.router, moe.shared] + ([moe.experts] if dims.ep == 1 else [])
            for param in (p for module in replicated if module is not None for p in module.parameters()):
                mark_partial(param, MeshDim.TP)


def apply_dual_stack_fully_shard(model: Transformer, dims: ParallelDims, views: MeshViews) -> None:
    dense = (
        views[MeshDim.DP_REPLICATE, MeshDim.FSDP, MeshDim.TP]
        if dims.tp > 1
        else views[MeshDim.DP_REPLICATE, MeshDim.FSDP]
    )
    for layer in model.layers:
        if isinstance(layer.feed_forward, MoE) and dims.ep > 1:  # with ep == 1 the experts are dense
            experts = fully_shard(layer.feed_forward.experts, mesh=views[MeshDim.DP_REPLICATE, MeshDim.EFSDP])
            experts.set_gradient_divide_factor(dims.dp_cp)
        fully_shard(layer, mesh=dense)
    fully_shard(model, mesh=dense)


def moe_workload(
    dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions, dispatch: str = "all_to_all"
) -> Workload:
    config = dataclasses.replace(MOE_CONFIG, seq_len=options.seq_len, num_experts=options.num_experts)
    with seeded_on_host(seed):
        model = Transformer(config)
    reference = copy.deepcopy(model)
    parallelize_transformer_tp(model, views[MeshDim.TP], sequence_parallel=True, moe_tokens_replicated=dims.etp > 1)
    apply_expert_parallel(model, dims, views, dispatch)
    if dims.cp > 1:
        apply_context_parallel(model, views)
    apply_dual_stack_fully_shard(model, dims, views)
    return lm_workload(model, reference, config, dims, seed, options.global_batch)


def expert_parallel(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """S1 / S2: all-to-all token dispatch."""
    return moe_workload(dims, views, seed, options, dispatch="all_to_all")


def expert_parallel_all_gather(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """S3: the S1 dims through a second dispatch path (all-gather tokens, reduce-scatter outputs)."""
    return moe_workload(dims, views, seed, options, dispatch="all_gather")
