"""Recipes on the mini transformer, applied in TorchTitan's order: TP(+SP) -> EP/ETP -> CP -> fully_shard.

One builder serves M2, M3, M5, M6, M7, the sequence-scheme variants (M5-R, M5-U, M6-U, and M5-UR: the
ring with a ulysses dim), async TP (M3-A, M6-A) and the dense tiers; the degrees decide which styles apply.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

from hyper_parallel.comm import GroupInfo
from hyper_parallel.devices import seeded_on_host
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import MeshViews
from hyper_parallel.models.transformer import Transformer, TransformerConfig, lm_loss, token_batch
from hyper_parallel.parallel.async_tp import parallelize_transformer_async_tp
from hyper_parallel.parallel.tp import parallelize_transformer_tp
from hyper_parallel.recipes.batches import data_parallel_rows, sequence_positions
from hyper_parallel.recipes.options import RunOptions
from hyper_parallel.recipes.training import Workload
from hyper_parallel.recipes.workload_facts import SequenceScheme

DENSE_CONFIG = TransformerConfig()


def apply_context_parallel(
    model: Transformer, views: MeshViews, scheme: SequenceScheme = SequenceScheme.ALL_GATHER
) -> None:
    """Swap every attention core for sequence-parallel attention over the cp group (``scheme``: how); with
    a ulysses dim, heads are resharded over it by all-to-all around the ring (2-D sequence parallelism)."""
    from hyper_parallel.parallel.cp import context_parallel_attention
    from hyper_parallel.parallel.ulysses import ulysses_attention, ulysses_ring_core

    scheme = SequenceScheme(scheme)
    cp = GroupInfo.from_mesh(views[MeshDim.CP], (MeshDim.CP,))
    if views.dims.ulysses > 1:
        if scheme != SequenceScheme.RING:
            raise ValueError(
                f"a ulysses dim composes with the ring (2-D sequence parallelism), not with {scheme.label}"
            )
        core = ulysses_ring_core(GroupInfo.from_mesh(views[MeshDim.ULYSSES], (MeshDim.ULYSSES,)), cp)
        for layer in model.layers:
            layer.attention.core = core
        return
    if scheme == SequenceScheme.ULYSSES:
        attention = ulysses_attention
    else:
        attention = functools.partial(context_parallel_attention, impl=scheme.value)
    for layer in model.layers:
        layer.attention.core = functools.partial(_cp_core, attention=attention, cp=cp)


def _cp_core(q, k, v, positions, *, attention, cp):
    return attention(q, k, v, cp, positions)


def apply_fully_shard(model: Transformer, views: MeshViews, enable_param_shard: bool | None) -> None:
    """Bottom-up: each transformer block is one unit, the root (embeddings, final norm, head) another."""
    mesh = views[MeshDim.DP_REPLICATE, MeshDim.FSDP]
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, enable_param_shard=enable_param_shard)
    fully_shard(model, mesh=mesh, enable_param_shard=enable_param_shard)


def transformer_workload(
    dims: ParallelDims,
    views: MeshViews,
    seed: int,
    options: RunOptions,
    *,
    sequence_parallel: bool,
    enable_param_shard: bool | None,
    config: TransformerConfig = DENSE_CONFIG,
    sequence_scheme: SequenceScheme = SequenceScheme.ALL_GATHER,
    async_tp: bool = False,
) -> Workload:
    """``async_tp``: TP+SP with each block's gather and scatter pipelined (``parallel.async_tp``) instead of
    torch's styles; the same numbers and bytes."""
    config = dataclasses.replace(config, seq_len=options.seq_len)
    with seeded_on_host(seed):
        model = Transformer(config)
    reference = copy.deepcopy(model)
    if async_tp:
        if not sequence_parallel:
            raise ValueError("async TP pipelines sequence parallelism's all-gather and reduce-scatter: it needs SP")
        parallelize_transformer_async_tp(model, views[MeshDim.TP], sequence_len=config.seq_len // dims.cp)
    else:
        parallelize_transformer_tp(model, views[MeshDim.TP], sequence_parallel=sequence_parallel)
    if dims.cp > 1 or dims.ulysses > 1:
        apply_context_parallel(model, views, sequence_scheme)
    apply_fully_shard(model, views, enable_param_shard)
    return lm_workload(model, reference, config, dims, seed, options.global_batch)


def lm_workload(
    model: Transformer, reference: Transformer, config: TransformerConfig, dims: ParallelDims, seed: int, batch: int
) -> Workload:
    """The next-token batch of a transformer recipe: this rank's rows (dp) and sequence chunks (cp)."""
    tokens, targets = token_batch(config, batch, seed)
    positions = sequence_positions(config.seq_len, dims)
    local_tokens = data_parallel_rows(tokens, dims)[:, positions]
    local_targets = data_parallel_rows(targets, dims)[:, positions]
    return Workload(
        model, reference, (local_tokens, positions), local_targets, (tokens,), targets, loss_fn=lm_loss, lr=0.5
    )


def tensor_parallel(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M2: TP without SP; data-parallel replicas (if any) all-reduce, nothing is sharded by FSDP."""
    return transformer_workload(dims, views, seed, options, sequence_parallel=False, enable_param_shard=False)


def tensor_sequence_parallel(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M3: TP + SP; norm weights get Partial gradients over tp that fully_shard sums."""
    return transformer_workload(dims, views, seed, options, sequence_parallel=True, enable_param_shard=False)


def fsdp_transformer_without_sp(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """B-1: TP without SP, then FSDP."""
    return transformer_workload(dims, views, seed, options, sequence_parallel=False, enable_param_shard=None)


def fsdp_transformer(
    dims: ParallelDims,
    views: MeshViews,
    seed: int,
    options: RunOptions,
    sequence_scheme: SequenceScheme = SequenceScheme.ALL_GATHER,
) -> Workload:
    """M5, M6, M7 and the dense tiers: whatever of TP+SP / CP the degrees ask for, then FSDP/HSDP
    (``sequence_scheme``: how the cp ranks attend, for M5-R, M5-U and M6-U)."""
    return transformer_workload(
        dims,
        views,
        seed,
        options,
        sequence_parallel=dims.tp > 1,
        enable_param_shard=None,
        sequence_scheme=sequence_scheme,
    )


def fsdp_transformer_ring(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M5-R: as fsdp_transformer, CP attention passing K/V around the cp ring with overlap (parallel/ring.py);
    M5-UR: the same ring, with heads resharded over the ulysses dim around it."""
    return fsdp_transformer(dims, views, seed, options, SequenceScheme.RING)


def fsdp_transformer_ulysses(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M5-U, M6-U: as fsdp_transformer, Ulysses attention (all-to-all to head shards and back)."""
    return fsdp_transformer(dims, views, seed, options, SequenceScheme.ULYSSES)


def async_tensor_sequence_parallel(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M3-A: M3 with each block's all-gather and reduce-scatter cut into chunks that overlap the matmuls."""
    return transformer_workload(
        dims, views, seed, options, sequence_parallel=True, enable_param_shard=False, async_tp=True
    )


def fsdp_transformer_async_tp(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M6-A: M6 (TP + SP + CP + FSDP) with async TP inside each block."""
    return transformer_workload(
        dims, views, seed, options, sequence_parallel=True, enable_param_shard=None, async_tp=True
    )


def float8_tensor_sequence_parallel(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """M3-F8: M3 with every block linear in float8 (torchao, tensorwise scales) and the block inputs gathered
    over tp in float8. The reference is the same model converted to float8 on one process (the same scales:
    amax is global under TP, and per data-parallel rank, so the reference steps on each dp rank's rows
    separately), so the run matches it to float32 rounding; against M3 it differs by what float8 costs
    (tests/test_float8.py derives the bound)."""
    from hyper_parallel.parallel.float8 import Float8WireAsBytes, convert_to_float8, parallelize_transformer_float8_tp

    config = dataclasses.replace(DENSE_CONFIG, seq_len=options.seq_len)
    with seeded_on_host(seed):
        model = Transformer(config)
    reference = convert_to_float8(copy.deepcopy(model))
    convert_to_float8(model)
    parallelize_transformer_float8_tp(model, views[MeshDim.TP])
    apply_fully_shard(model, views, enable_param_shard=False)
    workload = lm_workload(model, reference, config, dims, seed, options.global_batch)
    workload.step_context = Float8WireAsBytes
    workload.reference_slices = dims.dp
    return workload
