"""Every valid layout of a world size, costed and ranked by step time within the memory budget.

Kept apart from ``layouts`` (group structure, collective timing), which ``step_time`` and ``hardware``
build on: ranking needs all three, so it sits above them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyper_parallel.cost_model import ModelConfig, estimate
from hyper_parallel.cost_model.hardware import DEFAULT_HARDWARE
from hyper_parallel.cost_model.layouts import candidate_layouts
from hyper_parallel.cost_model.pipeline import SCHEDULE_LIST, get_schedule
from hyper_parallel.cost_model.stacks import get_stack
from hyper_parallel.cost_model.step_time import estimate_step
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes.workload_facts import SequenceScheme


@dataclass(frozen=True)
class RankedLayout:
    dims: ParallelDims
    memory_bytes: int
    comm_seconds: float  # every collective summed, no overlap
    fits: bool  # memory within the hardware's budget (memory - reserve)
    step_seconds: float = 0.0  # the middle of the step-time range (``step_time``)
    step_range: tuple[float, float] = (0.0, 0.0)
    mfu: float = 0.0  # at the middle step time
    exposed_seconds: float = 0.0  # communication the step waits for (critical + not hidden)
    bubble_seconds: float = 0.0  # the pipeline's fill and drain (pp > 1)
    choice: str = ""  # with ``choose``: the sequence scheme (cp > 1) and schedule (pp > 1) picked, e.g. "ring"


def variants(config: ModelConfig, dims: ParallelDims) -> list[tuple[str, ModelConfig]]:
    """The ways ``dims`` can run the model that ``choose`` compares: every sequence scheme when cp > 1 (K/V
    all-gather, ring, Ulysses), every schedule when pp > 1 (each with the stages per rank it runs: two
    for zbv and dualpipev, two for the interleaved ones, else one); the model as given otherwise."""
    schemes = list(SequenceScheme) if dims.cp > 1 else [config.sequence_scheme]
    schedules = [s.name for s in SCHEDULE_LIST] if dims.pp > 1 else [config.pp_schedule]
    out = []
    for scheme in schemes:
        for schedule in schedules:
            virtual = config.virtual_stages if dims.pp == 1 else get_schedule(schedule).default_stages_per_rank
            label = " ".join(x for x in (scheme if dims.cp > 1 else "", schedule if dims.pp > 1 else "") if x)
            out.append((label, config.replace(sequence_scheme=scheme, pp_schedule=schedule, virtual_stages=virtual)))
    return out


def rank_layouts(
    config: ModelConfig,
    world_size: int,
    gpus_per_node: int,
    hardware=None,
    sort: str = "time",
    choose: bool = False,
) -> list[RankedLayout]:
    """Every layout of ``world_size`` ranks the model fits and its stack runs (``stacks.Stack.parallelisms``;
    pp too for transformers: a pp > 1 candidate runs micro-batches of one row unless the model sets
    micro_batch or grad_accum, and splits its layers as torchtitan does unless ``stage_layers`` fits its pp;
    ep/etp only for MoE models), best first: layouts within the memory budget before the others, then by ``sort`` ("time":
    the step time of ``step_time`` on ``hardware`` (default ``hardware.DEFAULT_HARDWARE``), then memory;
    "memory": per-rank memory, then step time). ``choose``: each layout runs the fastest of its ``variants``
    that fits (the sequence scheme for cp > 1, the pipeline schedule for pp > 1), named in ``choice``."""
    hardware = hardware or DEFAULT_HARDWARE
    if sort not in ("time", "memory"):
        raise ValueError(f"sort must be 'time' or 'memory', got {sort!r}")
    ranked = []
    pipelined = config.replace(micro_batch=1) if config.micro_batch is None and config.grad_accum is None else config
    stack = get_stack(config.stack)
    for dims in candidate_layouts(world_size, config.is_moe, pipeline=config.architecture == "transformer"):
        if not stack.runs(dims.degrees()):
            continue
        candidate = pipelined if dims.pp > 1 else config
        options = variants(candidate, dims) if choose else [("", candidate)]
        costed = [r for r in (_costed(c, dims, gpus_per_node, hardware, label) for label, c in options) if r]
        if costed:
            ranked.append(min(costed, key=_fitting_then_fastest))
    if sort == "time":
        return sorted(ranked, key=_fitting_then_fastest)
    return sorted(ranked, key=lambda r: (not r.fits, r.memory_bytes, r.step_seconds))


def _costed(config: ModelConfig, dims: ParallelDims, gpus_per_node: int, hardware, choice: str) -> RankedLayout | None:
    """``dims`` costed under ``config``; None when the model refuses the layout (``estimate``'s ValueError)."""
    if config.stage_layers and len(config.stage_layers) != dims.pp * config.virtual_stages:
        config = config.replace(stage_layers=None)  # another pp: the layers split as torchtitan does
    try:
        cost = estimate(config, dims)
    except ValueError:
        return None
    step = estimate_step(cost, gpus_per_node, hardware)
    return RankedLayout(
        dims,
        cost.memory.total,
        sum(c.seconds for c in step.timed),
        cost.memory.total <= hardware.budget_bytes,
        step.seconds,
        (step.fast.total, step.slow.total),
        step.middle.mfu,
        step.middle.critical + step.middle.exposed,
        step.bubble_seconds,
        choice,
    )


def _fitting_then_fastest(layout: RankedLayout) -> tuple[bool, float, int]:
    """Within the memory budget first, then the shorter step, then the smaller memory."""
    return (not layout.fits, layout.step_seconds, layout.memory_bytes)
