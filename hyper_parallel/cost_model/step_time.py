"""A step's time on one rank: the work's compute time, the communication it hides, what it waits for,
and the pipeline's bubble.

Compute is ``work.work_time`` (GEMMs by shape, attention, memory-bound kernels, the optimizer step, at
the machine's calibrated constants), not an assumed fraction of peak; MFU = model FLOPs (no
recomputation) / (step x peak) is an output.

Which collectives can overlap compute:
    hidden-able   FSDP/HSDP/ZeRO (groups fsdp, efsdp, dp_replicate, dp_replicate+...): the next unit's
                  all-gather is prefetched while the current unit computes, reduce-scatters and HSDP
                  all-reduces run asynchronously behind the earlier units' backward
    critical      TP/SP (tp, etp), CP (cp), EP (ep) and the pipeline's sends (pp): their result is
                  the next op's input, so the step waits for them in full (P2P sends block as in
                  Megatron-LM 2021)
What the stack and the schedule change (``stacks``, ``pipeline``):
    dp_overlap False     the once-per-step gradient all-reduce runs after the backward: all of it waits
    zero3_prefetch 0     ZeRO-3's all-gathers are fetched on demand: all of them wait
    optimizer_gather     ZeRO-1/2's all-gather of the updated parameters (phase "step") waits ("exposed")
                         or overlaps the next forward ("hidden")
    async_tp             TP's collectives are cut into tp pieces overlapped with the matmuls: the first
                         piece waits, and whatever exceeds the GEMM time
    ring (cp)            ``sequence_scheme`` ring: each K/V block (and, in backward, each dK/dV block)
                         travels while the block in hand is attended, the rank's own block first, so only
                         what the sends exceed the attention time by waits (all-gather CP and Ulysses wait
                         in full: their result is the next op's input)
    DualPipe(V)          the EP all-to-alls and P2P overlap the paired chunk's compute: only what exceeds it
                         waits

Per micro-batch (m = grad_accum of them; work and hidden-able bytes split evenly) and per phase, with
C the phase's compute time, O its hidden-able communication time, and n the FSDP units: a prefetch
pipeline of n stages exposes the first stage's transfer and whatever the transfers exceed the compute by,

    exposed(O, C) = O / n + max(0, (n - 1) / n * (O - C))          (= O / n when O <= C)

The HSDP all-reduce (and, under a stack that reduces a pipeline stage once, the reduce-scatter) runs
behind the last micro-batch's backward. One rank's busy time is compute + critical + exposed. With
pp > 1 each stage is timed so, t_s = its busy time / m per microbatch, and with t the slowest stage's

    step = m t + bubble,   bubble = (pp - 1) x t x the schedule's factor (``pipeline``: 1 for GPipe and
                           1F1B, 1 / v interleaved, smaller for the zero-bubble and DualPipe schedules)

so bubble / step = ``pipeline.bubble_fraction`` for equal stages. The range: the compute ``band`` (20 %)
faster and slower. Ignored: contention between collectives on different links.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from hyper_parallel.cost_model import CostEstimate
from hyper_parallel.cost_model.compute import StepFlops, step_flops
from hyper_parallel.cost_model.hardware import Hardware
from hyper_parallel.cost_model.layouts import TimedCollective, time_collectives
from hyper_parallel.cost_model.pipeline import get_schedule
from hyper_parallel.cost_model.stacks import get_stack
from hyper_parallel.cost_model.work import WorkTime, work_time
from hyper_parallel.recipes.workload_facts import SequenceScheme

CRITICAL_GROUPS = ("tp", "etp", "cp", "ep", "pp")


def is_critical(group: str) -> bool:
    """True for activation collectives (TP/SP, CP, EP, P2P): nothing overlaps them in the base model."""
    return group in CRITICAL_GROUPS


@dataclass(frozen=True)
class StepTime:
    """One rank's step at one end of the range; seconds."""

    factor: float  # compute time x factor (1: the model's, 1 -+ band: the range)
    compute: float
    critical: float
    exposed: float  # hidden-able communication the compute did not cover
    hidden: float  # hidden-able communication behind compute
    mfu: float
    exposed_by_group: dict[str, float]
    hidden_by_group: dict[str, float]
    bubble: float = 0.0  # the pipeline's fill and drain
    work: WorkTime | None = None

    @property
    def total(self) -> float:
        return self.compute + self.critical + self.exposed + self.bubble


def pipeline_exposed(comm: float, compute: float, stages: int) -> float:
    """exposed(O, C) of the module docstring."""
    if comm <= 0:
        return 0.0
    return comm / stages + max(0.0, (stages - 1) / stages * (comm - compute))


def _waiting(c: TimedCollective, config, dims) -> str:
    """How a collective meets the compute: "critical", "overlapped" (only what exceeds the compute
    waits), "tp-async", "cp-ring", "once" (after the backward), "step" (after the optimizer) or a phase name."""
    stack = get_stack(config.stack)
    if c.group in get_schedule(config.pp_schedule).hides and dims.pp > 1:
        return "overlapped"
    if c.group == "tp" and config.async_tp:
        return "tp-async"
    if c.group == "cp" and config.sequence_scheme == SequenceScheme.RING:
        return "cp-ring"
    if is_critical(c.group):
        return "critical"
    if c.phase == "step":
        return "critical" if stack.optimizer_gather == "exposed" else "hidden"
    if c.op == "all_gather" and config.zero == 3 and not stack.zero3_prefetch:
        return "critical"
    reduced_once = config.zero == 1 or (dims.pp > 1 and stack.pp_grad_reduce == "once")
    once = c.op == "all_reduce" or (c.op == "reduce_scatter" and reduced_once)
    if once:
        return "once" if stack.dp_overlap else "critical"
    return c.phase


def _rank_step(
    cost: CostEstimate, units, timed: list[TimedCollective], work: WorkTime, flops: StepFlops, peak: float
) -> StepTime:
    """compute + critical + exposed of one rank (module docstring), no bubble."""
    config, dims = cost.config, cost.dims
    m = config.accumulation(dims)[1]
    forward_share = 1 / 3  # forward : backward (with recomputation) work, as the FLOPs split
    if flops.total:
        forward_share = flops.forward / flops.total
    forward_c = work.total * forward_share / m
    backward_c = work.total * (1 - forward_share) / m
    stages = max(1, sum(1 for u in units if u.shard_size > 1 or u.dp_size > 1))
    per_kind: dict[str, list[TimedCollective]] = defaultdict(list)
    for c in timed:
        per_kind[_waiting(c, config, dims)].append(c)
    seconds = {kind: sum(c.seconds for c in cs) for kind, cs in per_kind.items()}
    tp_async = seconds.get("tp-async", 0.0)
    critical_kinds = {"critical": seconds.get("critical", 0.0)}
    critical_kinds["tp-async"] = tp_async / dims.tp + max(0.0, tp_async - work.gemm) if tp_async else 0.0
    critical_kinds["overlapped"] = max(0.0, seconds.get("overlapped", 0.0) - work.total)
    critical_kinds["cp-ring"] = max(0.0, seconds.get("cp-ring", 0.0) - work.attention)
    critical = sum(critical_kinds.values())
    fwd, bwd = seconds.get("forward", 0.0) / m, seconds.get("backward", 0.0) / m
    once = seconds.get("once", 0.0)
    exposed_fwd = m * pipeline_exposed(fwd, forward_c, stages)
    exposed_bwd = (m - 1) * pipeline_exposed(bwd, backward_c, stages) + pipeline_exposed(bwd + once, backward_c, stages)
    hideable = m * (fwd + bwd) + once + seconds.get("hidden", 0.0)
    exposed = exposed_fwd + exposed_bwd
    exposed_by_group: dict[str, float] = defaultdict(float)
    hidden_by_group: dict[str, float] = defaultdict(float)
    for kind, collectives in per_kind.items():  # split each kind's waiting time in proportion to the groups'
        waited = critical_kinds.get(kind)
        for c in collectives:
            if waited is not None:
                share = c.seconds / seconds[kind] if seconds[kind] else 0.0
                exposed_by_group[c.group] += waited * share
                hidden_by_group[c.group] += c.seconds - waited * share
            else:
                share = c.seconds / hideable if hideable else 0.0
                exposed_by_group[c.group] += exposed * share
                hidden_by_group[c.group] += (hideable - exposed) * share
    total = work.total + critical + exposed
    return StepTime(
        1.0,
        work.total,
        critical,
        exposed,
        sum(seconds.values()) - critical - exposed,
        flops.model / (total * peak),
        dict(exposed_by_group),
        dict(hidden_by_group),
        0.0,
        work,
    )


@dataclass(frozen=True)
class StepEstimate:
    """A layout's step on ``hardware``: the fast end, the model's step (middle), the slow end."""

    fast: StepTime
    middle: StepTime
    slow: StepTime
    flops: StepFlops  # per rank, averaged over the pipeline's stages
    timed: list[TimedCollective]  # the reported (worst-memory) stage's ranks
    stage_seconds: tuple[float, ...] = ()  # per pp rank: busy time of one step, no bubble

    @property
    def seconds(self) -> float:
        return self.middle.total

    @property
    def bubble_seconds(self) -> float:
        return self.middle.bubble

    @property
    def inter_node_bytes(self) -> float:
        """Bytes one rank sends over its NIC in one step (wire bytes of collectives spanning nodes)."""
        return sum(c.wire_bytes for c in self.timed if c.crosses_nodes)


def _stage_costs(cost: CostEstimate) -> list[tuple]:
    """(signature, units, collectives, layers, head) per pp rank; the whole model as one stage when pp == 1."""
    if not cost.stages:
        return [((), cost.units, cost.collectives, None, True)]
    return [(s.signature, s.units, s.collectives, s.layers, s.last) for s in cost.stages]


def _at(step: StepTime, factor: float, peak: float, model_flops: float) -> StepTime:
    compute = step.compute * factor
    total = compute + step.critical + step.exposed + step.bubble * factor
    return dataclasses.replace(
        step, factor=factor, compute=compute, bubble=step.bubble * factor, mfu=model_flops / (total * peak)
    )


def estimate_step(cost: CostEstimate, gpus_per_node: int, hardware: Hardware) -> StepEstimate:
    """The module docstring's step of ``cost`` on ``hardware``, and its range; stages alike (same
    signature, ``stages.StageCost``) are timed once."""
    config, dims = cost.config, cost.dims
    flops = step_flops(config, dims)
    per_stage, timed_once = [], {}
    for signature, units, collectives, layers, head in _stage_costs(cost):
        if signature not in timed_once:
            timed = time_collectives(dims, collectives, gpus_per_node, hardware.bandwidth)
            stage_flops = step_flops(config, dims, layers, head) if layers is not None else flops
            work = work_time(config, dims, hardware, units, layers, head)
            timed_once[signature] = (timed, _rank_step(cost, units, timed, work, stage_flops, hardware.peak_flops))
        per_stage.append((collectives is cost.collectives, *timed_once[signature]))
    slowest = max(per_stage, key=lambda item: item[2].total)[2]
    reported = next(step for is_reported, _, step in per_stage if is_reported)
    timed = next(t for is_reported, t, _ in per_stage if is_reported)
    m = config.accumulation(dims)[1]
    factor = get_schedule(config.pp_schedule).bubble_factor(config.virtual_stages)
    bubble = (dims.pp - 1) * factor * slowest.total / m if dims.pp > 1 else 0.0
    middle = dataclasses.replace(
        slowest,
        compute=slowest.compute,
        bubble=bubble,
        exposed_by_group=reported.exposed_by_group if dims.pp == 1 else slowest.exposed_by_group,
    )
    middle = _at(middle, 1.0, hardware.peak_flops, flops.model)
    band = hardware.band
    return StepEstimate(
        _at(middle, 1 - band, hardware.peak_flops, flops.model),
        middle,
        _at(middle, 1 + band, hardware.peak_flops, flops.model),
        flops,
        timed,
        tuple(step.total for _, _, step in per_stage) if dims.pp > 1 else (),
    )
