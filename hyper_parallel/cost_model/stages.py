"""Pipeline parallelism costed per stage: which layers a pp rank holds, its memory with the microbatches
in flight, and its collectives (FSDP once per step, TP/CP/EP of its own layers, P2P).

Placement (torchtitan's and Megatron's): the L layers split into pp * v chunks of L / (pp v) layers
(v = ``ModelConfig.virtual_stages``, 1 unless interleaved); chunk j runs on pp rank j mod pp. The
embedding (and learned positions) sit on chunk 0, the final norm and the LM head on the last chunk,
so pp rank 0 and pp rank pp - 1 carry them; a tied head keeps its own copy on the last stage.

Activations alive at once on pp rank r, with m microbatches (``pipeline.alive_microbatches`` for the
first two; counts of one microbatch's activations of the rank's layers):
    gpipe             m                         (every forward before the first backward)
    1f1b              min(m, pp - r)            (warm-up of pp - r - 1 forwards, then one in flight)
    interleaved_1f1b  min(m v, 2 (pp - r - 1) + (v - 1) pp + 1) / v   (Megatron-LM's warm-up count of
                      chunks plus the one in flight; each chunk is 1 / v of the rank's layers)

Memory of a stage: its units' shards exactly (``units``), gathered parameters and unsharded gradients
as ``memory.pipelined_gathered_bytes`` (gradients reduced once per step), the activations above. The
plan reports the worst stage (the largest total); every stage's memory is kept in ``stages``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from hyper_parallel.cost_model.communication import Collective, merged, p2p_collectives, step_collectives
from hyper_parallel.cost_model.memory import Memory, activation_bytes, pipelined_gathered_bytes
from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.cost_model.pipeline import alive_microbatches
from hyper_parallel.cost_model.units import Unit, build_units
from hyper_parallel.mesh import ParallelDims

EMBEDDING_PARAMS = ("tok_embeddings.weight", "pos_embeddings.weight")


@dataclass(frozen=True)
class StageCost:
    """One pp rank: its layers, units, memory at the peak and collectives of one step."""

    pp_rank: int
    layers: tuple[int, ...]
    first: bool  # holds the embedding
    last: bool  # holds the final norm and the head
    alive: float  # microbatches of activations held at the peak (in units of the rank's layers)
    units: list[Unit]
    memory: Memory
    collectives: list[Collective]


def rank_layers(config: ModelConfig, pp: int) -> list[tuple[int, ...]]:
    """The layers of each pp rank (module docstring, "Placement")."""
    chunks = pp * config.virtual_stages
    size = config.n_layers // chunks
    return [
        tuple(layer for chunk in range(rank, chunks, pp) for layer in range(chunk * size, (chunk + 1) * size))
        for rank in range(pp)
    ]


def alive_on_rank(config: ModelConfig, pp: int, microbatches: int, rank: int) -> float:
    """Microbatches of the rank's activations held at once (module docstring)."""
    if config.pp_schedule != "interleaved_1f1b":
        return float(alive_microbatches(config.pp_schedule, pp, microbatches, rank))
    v = config.virtual_stages
    chunks = min(microbatches * v, 2 * (pp - rank - 1) + (v - 1) * pp + 1)
    return chunks / v


def stage_view(config: ModelConfig, layers: tuple[int, ...]) -> ModelConfig:
    """The model as one stage sees it: its layers renumbered from 0, MoE layers kept (for the per-layer
    counts of ``communication``)."""
    return config.replace(
        n_layers=len(layers), moe_layers=tuple(i for i, layer in enumerate(layers) if layer in config.moe_layers)
    )


def _stage_units(units: list[Unit], config: ModelConfig, layers: tuple[int, ...], first: bool, last: bool):
    names = {f"layers.{layer}" for layer in layers}
    kept = [u for u in units if not u.is_root and u.name.removesuffix(".feed_forward.experts") in names]
    root = next(u for u in units if u.is_root)
    params = []
    for param in root.params:
        on_first = param.name in EMBEDDING_PARAMS
        if (on_first and first) or (not on_first and last):
            params.append(param)
    if last and config.tied_embeddings and not first:  # the head's own copy of the tied table
        table = next(p for p in root.params if p.name == "tok_embeddings.weight")
        params.append(dataclasses.replace(table, name="output.weight"))
    return kept + ([dataclasses.replace(root, params=tuple(params))] if params else [])


def pipeline_stages(config: ModelConfig, dims: ParallelDims) -> list[StageCost]:
    """Every pp rank's cost (module docstring); ``config.check(dims)`` has passed."""
    units = build_units(config, dims)
    microbatches = config.accumulation(dims)[1]
    precision = config.precision
    result = []
    for rank, layers in enumerate(rank_layers(config, dims.pp)):
        first, last = rank == 0, rank == dims.pp - 1
        mine = _stage_units(units, config, layers, first, last)
        shard = sum(u.shard_numel for u in mine)
        alive = alive_on_rank(config, dims.pp, microbatches, rank)
        memory = Memory(
            parameters=shard * precision.storage,
            gradients=shard * precision.storage,
            optimizer=shard * precision.optimizer_state,
            gathered=pipelined_gathered_bytes(mine, config),
            activations=int(alive * activation_bytes(config, dims, layers, head=last)),
        )
        view = stage_view(config, layers)
        warmup = min(microbatches, math.ceil(alive))
        collectives = merged(
            step_collectives(view, dims, mine, first, last, warmup) + p2p_collectives(config, dims, rank)
        )
        result.append(StageCost(rank, layers, first, last, alive, mine, memory, collectives))
    return result


def worst_stage(stages: list[StageCost]) -> StageCost:
    """The stage with the largest memory (the first of equals): the one a plan reports."""
    return max(stages, key=lambda s: (s.memory.total, -s.pp_rank))
