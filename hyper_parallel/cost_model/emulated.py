"""The α-β model of a recipe run on an emulated link (``hyper_parallel.link``): its communication time,
what overlap hides of it, and the step time, to hold against the measured run.

The bytes are the cost model's (``estimate(recipe_model(recipe, options), dims)``: the traces' exactly,
tests/test_cost_model.py), each call timed as the link times it, α + bytes x wire_factor x β
(``Link.seconds``). The compute and the step's own bookkeeping (hooks, the optimizer) are this CPU's,
measured in the run (``hyper_parallel.viz.overlap.step_phases``): the model predicts the communication,
not a CPU's speed. Per phase, with O the phase's communication time, C its compute and n the fully_shard
units that communicate:

    overlap off        exposed = O (every collective issued and waited for on the spot)
    overlap on         forward:  exposed = O_f (this fully_shard prefetches in backward only: a unit's
                                 forward all-gather is issued when the unit starts)
                       backward: exposed = O_b / n + max(0, (n - 1) / n x (O_b - C_b))  (cost_model.step_time's
                                 prefetch pipeline: the next unit's all-gather and the reduce-scatters in
                                 flight behind the backward of the units after them)
    TP / CP / EP       exposed in full either way (``step_time.is_critical``: the next op needs the result)
    step               = compute + other + exposed

Torch-free, as the rest of the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyper_parallel.cost_model import estimate, recipe_model
from hyper_parallel.cost_model.step_time import is_critical, pipeline_exposed
from hyper_parallel.link import Link, wire_factor
from hyper_parallel.mesh import ParallelDims


@dataclass(frozen=True)
class EmulatedStep:
    """One rank's step on the emulated link as the model has it; seconds."""

    compute: float  # measured
    other: float  # measured: the step outside compute and communication (hooks, the optimizer)
    communication: float  # every collective's α + n·β, summed
    exposed: float  # of ``communication``, the time no compute runs beside it

    @property
    def hidden(self) -> float:
        return self.communication - self.exposed

    @property
    def total(self) -> float:
        return self.compute + self.other + self.exposed


def link_seconds(recipe: str, options: dict[str, int] | None, dims: ParallelDims, link: Link) -> dict[str, float]:
    """Seconds the link takes for one step's collectives of one rank, per phase ("forward", "backward")
    and, apart, "critical" (TP, CP, EP: never hidden): each call α + its bytes x wire_factor x β."""
    result = {"forward": 0.0, "backward": 0.0, "critical": 0.0}
    for c in estimate(recipe_model(recipe, options), dims).collectives:
        seconds = c.count * link.latency_s + c.bytes * wire_factor(c.op, c.group_size) * link.beta
        result["critical" if is_critical(c.group) else c.phase] += seconds
    return result


def communicating_units(recipe: str, options: dict[str, int] | None, dims: ParallelDims) -> int:
    """The fully_shard units that gather or reduce (the stages of the prefetch pipeline)."""
    units = estimate(recipe_model(recipe, options), dims).units
    return max(1, sum(1 for u in units if u.shard_size > 1 or u.dp_size > 1))


def emulated_step(
    recipe: str,
    options: dict[str, int] | None,
    dims: ParallelDims,
    link: Link,
    *,
    overlap: bool,
    compute: dict[str, float],
    other: float,
) -> EmulatedStep:
    """The module docstring's step of a run of ``recipe`` (its resolved ``options``) on ``dims`` over ``link``;
    ``compute``: the measured compute per phase ("forward", "backward"), ``other``: the measured rest."""
    seconds = link_seconds(recipe, options, dims, link)
    total = sum(seconds.values())
    if overlap:
        units = communicating_units(recipe, options, dims)
        exposed = (
            seconds["critical"]
            + seconds["forward"]
            + pipeline_exposed(seconds["backward"], compute.get("backward", 0.0), units)
        )
    else:
        exposed = total
    return EmulatedStep(sum(compute.values()), other, total, exposed)
