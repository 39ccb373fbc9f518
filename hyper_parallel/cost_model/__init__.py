"""An analytic cost model of a parallel layout: per-rank memory and per-step communication, no processes.

Torch-free, so the launcher (``python -m launch plan``) and a notebook widget can call it instantly for
any world size:

    from hyper_parallel.cost_model import estimate, get_model
    cost = estimate(get_model("llama-8b-like"), ParallelDims(world_size=4096, dp_replicate=8, cp=2, tp=16))
    cost.memory.total, cost.by_op_group()[("all_gather", "fsdp")], cost.units[0].shard_numel

Formulas: ``units`` (which parameters every rank stores, padding included), ``communication`` (bytes
of every collective of one step), ``memory`` (sharded state exactly, activations estimated),
``layouts`` (node placement, a bandwidth model, ranking several layouts), ``compute`` (FLOPs per rank,
recomputation included), ``hardware`` (machine presets), ``step_time`` (overlap, exposed communication,
a step-time range and MFU), ``review`` (named layouts side by side: ranks with ties, Pareto front,
warnings), ``alpha_beta`` (a collective's time as latency x steps + bytes / bandwidth: fitted to timed
collectives in notebook 00b, applied to the presets' links). Training knobs (micro-batch, activation
checkpointing, loss parallel, ...) are ``ModelConfig`` fields, so every view honours them. For the recipes' tiny models
(``recipe_model("M6")``) the bytes equal the traced runs' exactly (tests/test_cost_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from hyper_parallel.cost_model.communication import Collective, by_op_group, counts, step_collectives, wire_factor
from hyper_parallel.cost_model.memory import Memory, memory
from hyper_parallel.cost_model.model_configs import PRECISIONS, ModelConfig, Precision
from hyper_parallel.cost_model.presets import CLI_MODELS, PRESETS, get_model, load_model_config, recipe_model
from hyper_parallel.cost_model.stages import StageCost, pipeline_stages, stage_view, worst_stage
from hyper_parallel.cost_model.units import Param, Unit, build_units, parameter_count
from hyper_parallel.mesh import ParallelDims


@dataclass(frozen=True)
class CostEstimate:
    config: ModelConfig
    dims: ParallelDims
    units: list[Unit]
    memory: Memory  # the worst pipeline stage's with pp > 1
    collectives: list[Collective]  # of that stage's ranks
    stages: tuple[StageCost, ...] = ()  # every pp rank's, when pp > 1

    def by_op_group(self) -> dict[tuple[str, str], float]:
        return by_op_group(self.collectives)

    def counts(self) -> dict[tuple[str, str, str], int]:
        return counts(self.collectives)

    @property
    def parameter_count(self) -> int:
        """Parameters of the whole model (global shapes)."""
        return parameter_count(self.config)


def estimate(config: ModelConfig, dims: ParallelDims) -> CostEstimate:
    """Memory and communication of ``config`` on ``dims``; ``ValueError`` if the model does not fit them."""
    config.check(dims)
    if dims.pp > 1:
        stages = pipeline_stages(config, dims)
        worst = worst_stage(stages)
        return CostEstimate(config, dims, worst.units, worst.memory, worst.collectives, tuple(stages))
    units = build_units(config, dims)
    view = stage_view(config, tuple(range(config.total_layers))) if config.mtp_layers else config
    return CostEstimate(config, dims, units, memory(config, dims, units), step_collectives(view, dims, units))


__all__ = [
    "CLI_MODELS",
    "PRECISIONS",
    "PRESETS",
    "Collective",
    "CostEstimate",
    "Memory",
    "ModelConfig",
    "Param",
    "Precision",
    "StageCost",
    "Unit",
    "build_units",
    "estimate",
    "get_model",
    "load_model_config",
    "recipe_model",
    "wire_factor",
]
