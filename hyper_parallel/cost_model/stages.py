"""Pipeline parallelism costed per stage: which layers a pp rank holds, its memory with the microbatches
in flight, and its collectives (FSDP once per step, TP/CP/EP of its own layers, P2P).

Placement (``pipeline``): the L layers split into S = pp * v stages (v = ``ModelConfig.virtual_stages``)
of ``pipeline.stage_layer_counts`` layers, given (``ModelConfig.stage_layers``) or split evenly, the
first and last stage one short when they do not divide (torchtitan's split); stage s runs on the rank
``pipeline.stage_rank`` gives (loop: s mod pp; V schedules: rank 0 holds the first and the last). The
embedding (and learned positions) sit on stage 0, the final norm, the LM head and the multi-token-
prediction modules on the last stage; a tied head keeps its own copy there.

Activations alive at once on pp rank r: its schedule's warm-up forwards (``pipeline.alive_microbatches``)
taken in the order the schedule runs them (N microbatches on one of the rank's stages, then the next:
torch's interleaving), each counting the layers of the stage it runs, so a stage holding only the
embedding (Llama 3's first) adds nothing; the head's float32 logits of one microbatch (GPipe: all m).
With the stack's ``pp_outputs_kept`` "all" (torch.distributed.pipelining) every stage of the rank also keeps
all m microbatches' outputs for the whole step (``kept_output_bytes``): d / sp per token in the compute
dtype, the last stage's the logits, V (V / tp under loss parallelism) per token.

Memory of a stage: its units' state exactly (``memory.state_bytes``), gathered parameters and unsharded
gradients as ``memory.pipelined_gathered_bytes``, the activations above. The plan reports the worst stage
(the largest total); every stage's memory is kept in ``stages``. Stages alike (same layers of each kind,
same embedding/head, same microbatches in flight and P2P) are costed once: a --compare costs thousands
of layouts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from hyper_parallel.cost_model.communication import Collective, merged, p2p_collectives, step_collectives
from hyper_parallel.cost_model.memory import Memory, activation_bytes, pipelined_gathered_bytes, state_bytes
from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.cost_model.pipeline import (
    alive_microbatches,
    get_schedule,
    rank_stage_indices,
    stage_layer_counts,
)
from hyper_parallel.cost_model.stacks import get_stack
from hyper_parallel.cost_model.units import Unit, build_units
from hyper_parallel.mesh import ParallelDims

EMBEDDING_PARAMS = (
    "tok_embeddings.weight",
    "pos_embeddings.weight",
    "tok_embeddings_norm.weight",
    "tok_embeddings_norm.bias",
)


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
    chunks: tuple[tuple[int, ...], ...] = ()  # the layers of each of the rank's stages, in stage order
    signature: tuple = ()  # equal for stages that cost the same (step_time costs each once)


def stage_layers(config: ModelConfig, pp: int) -> list[tuple[int, ...]]:
    """The layers of every stage in stage order (module docstring, "Placement")."""
    counts = stage_layer_counts(config.n_layers, pp * config.virtual_stages, config.stage_layers)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [tuple(range(start, start + count)) for start, count in zip(starts, counts)]


def rank_chunks(config: ModelConfig, pp: int) -> list[tuple[tuple[int, ...], ...]]:
    """Per pp rank, the layers of each of its stages (the multi-token-prediction blocks on the last)."""
    layers = stage_layers(config, pp)
    mtp = tuple(range(config.n_layers, config.total_layers))
    last = len(layers) - 1
    return [
        tuple(layers[s] + (mtp if s == last else ()) for s in stages)
        for stages in rank_stage_indices(config.pp_schedule, pp, config.virtual_stages)
    ]


def rank_layers(config: ModelConfig, pp: int) -> list[tuple[int, ...]]:
    """The layers of each pp rank (module docstring, "Placement")."""
    return [tuple(layer for chunk in chunks for layer in chunk) for chunks in rank_chunks(config, pp)]


def alive_on_rank(config: ModelConfig, pp: int, microbatches: int, rank: int, chunks=None) -> float:
    """Microbatches of the rank's activations held at once, in units of all its layers (module docstring):
    the schedule's warm-up forwards, each weighted by the layers of the stage it runs."""
    v = config.virtual_stages
    alive = alive_microbatches(config.pp_schedule, pp, microbatches, rank, v)
    chunks = chunks if chunks is not None else rank_chunks(config, pp)[rank]
    total = sum(len(c) for c in chunks)
    if get_schedule(config.pp_schedule).stages_per_rank != "several" or not total:
        return alive
    per_round = microbatches // max(1, microbatches // pp)
    ops = round(alive * v)  # forwards in flight, on the rank's stages in turn, per_round at a time
    layers = sum(len(chunks[(op // per_round) % v]) for op in range(ops))
    return layers / total


def kept_output_bytes(config: ModelConfig, dims: ParallelDims, stages: int, last: bool, microbatches: int) -> int:
    """The stage outputs a pp rank keeps all step under the stack's ``pp_outputs_kept`` "all" (module
    docstring): every microbatch's output of each of the rank's ``stages``, the last stage's being the
    logits in the compute dtype."""
    if dims.pp == 1 or get_stack(config.stack).pp_outputs_kept != "all":
        return 0
    sp = dims.tp if config.uses_sequence_parallel(dims) else 1
    hidden = config.d_model / sp
    logits = config.vocab_size / (dims.tp if config.loss_parallel else 1)
    per_token = (stages - 1) * hidden + (logits if last else hidden)
    tokens = config.accumulation(dims)[0] * (config.seq_len // dims.cp)
    return int(microbatches * tokens * per_token * config.precision.compute)


def stage_view(config: ModelConfig, layers: tuple[int, ...]) -> ModelConfig:
    """The model as one stage sees it: its layers renumbered from 0, MoE layers kept (for the per-layer
    counts of ``communication``); multi-token-prediction blocks become plain layers of the stage."""
    return config.replace(
        n_layers=len(layers),
        moe_layers=tuple(i for i, layer in enumerate(layers) if config.is_moe_layer(layer)),
        mtp_layers=0,
        stage_layers=None,
        pp_schedule="1f1b",
        virtual_stages=1,
    )


def _units_by_layer(units: list[Unit]) -> tuple[dict[int, list[Unit]], Unit]:
    """Each layer's units (its block and, with EP, its experts; ``mtp.k`` as layer n_layers + k), and the root."""
    by_layer: dict[int, list[Unit]] = {}
    root = units[-1]
    n_layers = sum(1 for u in units if u.name.startswith("layers.") and u.name.count(".") == 1)
    for unit in units[:-1]:
        head, index = unit.name.split(".")[:2]
        layer = int(index) + (n_layers if head == "mtp" else 0)
        by_layer.setdefault(layer, []).append(unit)
    return by_layer, root


def _stage_units(by_layer, root: Unit, config: ModelConfig, layers: tuple[int, ...], first: bool, last: bool):
    kept = [u for layer in layers for u in by_layer.get(layer, ())]
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
    by_layer, root = _units_by_layer(build_units(config, dims))
    microbatches = config.accumulation(dims)[1]
    every_chunks = rank_chunks(config, dims.pp)
    stage_count = dims.pp * config.virtual_stages
    placement = rank_stage_indices(config.pp_schedule, dims.pp, config.virtual_stages)
    memories: dict[tuple, Memory] = {}
    communication: dict[tuple, list[Collective]] = {}
    result = []
    for rank, chunks in enumerate(every_chunks):
        layers = tuple(layer for chunk in chunks for layer in chunk)
        first, last = 0 in placement[rank], stage_count - 1 in placement[rank]
        mine = _stage_units(by_layer, root, config, layers, first, last)
        alive = alive_on_rank(config, dims.pp, microbatches, rank, chunks)
        p2p = p2p_collectives(config, dims, rank)
        moe = sum(1 for layer in layers if config.is_moe_layer(layer))
        signature = (len(layers) - moe, moe, first, last, tuple((c.op, c.phase, c.bytes) for c in p2p))
        if signature not in communication:
            # the step time depends on this signature only; the schedule's warm-up, which splits the FSDP
            # all-gathers between forward and backward (not their sum), is the first such rank's (the
            # most microbatches in flight)
            warmup = min(microbatches, math.ceil(alive))
            view = stage_view(config, layers)
            communication[signature] = merged(step_collectives(view, dims, mine, first, last, warmup) + p2p)
        if (signature, alive) not in memories:
            parameters, gradients, optimizer = state_bytes(mine, config)
            logits_alive = microbatches if config.pp_schedule == "gpipe" else 1
            memories[signature, alive] = Memory(
                parameters=parameters,
                gradients=gradients,
                optimizer=optimizer,
                gathered=pipelined_gathered_bytes(mine, config),
                activations=activation_bytes(config, dims, layers, last, alive, logits_alive, first)
                + kept_output_bytes(config, dims, len(chunks), last, microbatches),
            )
        collectives, memory = communication[signature], memories[signature, alive]
        result.append(StageCost(rank, layers, first, last, alive, mine, memory, collectives, chunks, signature))
    return result


def worst_stage(stages: list[StageCost]) -> StageCost:
    """The stage with the largest memory (the first of equals): the one a plan reports."""
    return max(stages, key=lambda s: (s.memory.total, -s.pp_rank))
