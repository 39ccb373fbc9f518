"""A step's time on one rank: compute, the communication it hides, the communication it waits for.

Which collectives can overlap compute:
    hidden-able   FSDP/HSDP (groups fsdp, efsdp, dp_replicate, dp_replicate+...): the next unit's
                  all-gather is prefetched while the current unit computes, reduce-scatters and HSDP
                  all-reduces run asynchronously behind the earlier units' backward
    critical      TP/SP (tp, etp), CP (cp) and EP (ep): their result is the next op's input, so the
                  step waits for them in full (conservative for ring attention, whose K/V shifts can
                  overlap the previous block's attention; async-TP is not modelled either)

Per micro-batch (m = grad_accum of them; FLOPs and hidden-able bytes split evenly) and per phase, with
C the phase's compute time, O its hidden-able communication time (both all-gathers and reduce-scatters,
one link), and n the FSDP units: a prefetch pipeline of n stages exposes the first stage's transfer and
whatever the transfers exceed the compute by,

    exposed(O, C) = O / n + max(0, (n - 1) / n * (O - C))          (= O / n when O <= C)

The HSDP all-reduce runs once, behind the last micro-batch's backward. Then

    step = compute + critical + sum of exposed,    compute = FLOPs (with recomputation) / (peak x eff)

for eff in ``Hardware.efficiency`` (low, high): the step-time range, with its middle for ranking.
MFU = model FLOPs (no recomputation) / (step x peak). Ignored: the optimizer step, kernel-launch gaps
beyond ``eff``, contention between collectives on different links (summed as if they shared one).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hyper_parallel.cost_model import CostEstimate
from hyper_parallel.cost_model.compute import StepFlops, step_flops
from hyper_parallel.cost_model.hardware import Hardware
from hyper_parallel.cost_model.layouts import TimedCollective, timed_collectives

CRITICAL_GROUPS = ("tp", "etp", "cp", "ep")


def is_critical(group: str) -> bool:
    """True for activation collectives (TP/SP, CP, EP): nothing overlaps them in this model."""
    return group in CRITICAL_GROUPS


@dataclass(frozen=True)
class StepTime:
    """One rank's step at one compute efficiency; seconds."""

    efficiency: float
    compute: float
    critical: float
    exposed: float  # hidden-able communication the compute did not cover
    hidden: float  # hidden-able communication behind compute
    mfu: float
    exposed_by_group: dict[str, float]
    hidden_by_group: dict[str, float]

    @property
    def total(self) -> float:
        return self.compute + self.critical + self.exposed


def _pipeline_exposed(comm: float, compute: float, stages: int) -> float:
    """exposed(O, C) of the module docstring."""
    if comm <= 0:
        return 0.0
    return comm / stages + max(0.0, (stages - 1) / stages * (comm - compute))


def step_time(
    cost: CostEstimate, timed: list[TimedCollective], flops: StepFlops, hardware: Hardware, efficiency: float
) -> StepTime:
    """The module docstring's step at one efficiency."""
    m = cost.config.accumulation(cost.dims)[1]
    rate = hardware.peak_flops * efficiency
    forward_c = flops.forward / m / rate
    backward_c = (flops.backward + flops.recompute) / m / rate
    stages = max(1, sum(1 for u in cost.units if u.shard_size > 1 or u.dp_size > 1))
    per_phase: dict[str, list[TimedCollective]] = defaultdict(list)  # hidden-able, per micro-batch or once
    critical, per_group = 0.0, defaultdict(float)
    for c in timed:
        if is_critical(c.group):
            critical += c.seconds
        elif c.op == "all_reduce":
            per_phase["once"].append(c)
        else:
            per_phase[c.phase].append(c)
        per_group[c.group] += c.seconds
    fwd = sum(c.seconds for c in per_phase["forward"]) / m
    bwd = sum(c.seconds for c in per_phase["backward"]) / m
    once = sum(c.seconds for c in per_phase["once"])
    exposed_fwd = m * _pipeline_exposed(fwd, forward_c, stages)
    exposed_bwd = (m - 1) * _pipeline_exposed(bwd, backward_c, stages) + _pipeline_exposed(
        bwd + once, backward_c, stages
    )
    hideable = m * (fwd + bwd) + once
    exposed = exposed_fwd + exposed_bwd
    exposed_by_group, hidden_by_group = {}, {}
    for group, seconds in per_group.items():  # split the phase totals in proportion to each group's time
        if is_critical(group):
            exposed_by_group[group], hidden_by_group[group] = seconds, 0.0
        else:
            share = seconds / hideable if hideable else 0.0
            exposed_by_group[group] = exposed * share
            hidden_by_group[group] = (hideable - exposed) * share
    compute = m * (forward_c + backward_c)
    total = compute + critical + exposed
    return StepTime(
        efficiency,
        compute,
        critical,
        exposed,
        hideable - exposed,
        flops.model / (total * hardware.peak_flops),
        exposed_by_group,
        hidden_by_group,
    )


@dataclass(frozen=True)
class StepEstimate:
    """A layout's step on ``hardware``: the fast end (high efficiency), the middle, the slow end."""

    fast: StepTime
    middle: StepTime
    slow: StepTime
    flops: StepFlops
    timed: list[TimedCollective]

    @property
    def seconds(self) -> float:
        return self.middle.total

    @property
    def inter_node_bytes(self) -> float:
        """Bytes one rank sends over its NIC in one step (wire bytes of collectives spanning nodes)."""
        return sum(c.wire_bytes for c in self.timed if c.crosses_nodes)


def estimate_step(cost: CostEstimate, gpus_per_node: int, hardware: Hardware) -> StepEstimate:
    timed = timed_collectives(cost, gpus_per_node, hardware.bandwidth)
    flops = step_flops(cost.config, cost.dims)
    low, high = hardware.efficiency
    times = [step_time(cost, timed, flops, hardware, eff) for eff in (high, (low + high) / 2, low)]
    return StepEstimate(*times, flops, timed)
