"""The idea of a pipeline before its measurement: an idealized schedule of p stages and m microbatches.

Every forward and every backward takes one time unit, communication is free, and each stage runs its
actions in the schedule's order as soon as their inputs exist: F(s, i) after F(s-1, i) (the activation
arrives), B(s, i) after B(s+1, i) (its gradient arrives) and after F(s, i). GPipe's order on every stage
is F0..F(m-1) then B0..B(m-1); 1F1B's stage s runs p-1-s warm-up forwards (the last stage none), then
alternates one forward and one backward, then drains the remaining backwards. The idle share of each
stage is then exactly the bubble formula (p-1)/(m+p-1) of ``cost_model.pipeline.bubble_fraction``
(tests/test_pipeline_concept.py holds the two equal): the simulation and the formula are independent.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.patches import Patch

from hyper_parallel.viz.pipeline import ACTION_COLORS
from hyper_parallel.viz.style import new_figure

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Action:
    stage: int
    action: str  # "forward" or "backward"
    microbatch: int
    start: int
    end: int


def stage_order(schedule: str, pp: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """The (action, microbatch) order one stage runs."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if pp < 1 or microbatches < 1 or not 0 <= stage < pp:
        raise ValueError(f"need pp >= 1, microbatches >= 1 and 0 <= stage < pp, got {pp}, {microbatches}, {stage}")
    forwards = [("forward", i) for i in range(microbatches)]
    backwards = [("backward", i) for i in range(microbatches)]
    if schedule == "gpipe":
        return forwards + backwards
    warmup = min(pp - 1 - stage, microbatches)
    order = forwards[:warmup]
    for i in range(warmup, microbatches):
        order += [forwards[i], backwards[i - warmup]]
    return order + backwards[microbatches - warmup :]


def ideal_pipeline(schedule: str, pp: int, microbatches: int) -> list[Action]:
    """Every action of one step with its start and end in time units (module docstring)."""
    orders = {s: stage_order(schedule, pp, microbatches, s) for s in range(pp)}
    done: dict[tuple[int, str, int], int] = {}
    free = dict.fromkeys(range(pp), 0)
    position = dict.fromkeys(range(pp), 0)
    actions = []
    while len(actions) < 2 * pp * microbatches:
        progressed = False
        for s in range(pp):
            if position[s] == len(orders[s]):
                continue
            action, i = orders[s][position[s]]
            needs = [(s - 1, "forward", i)] if action == "forward" and s > 0 else []
            if action == "backward":
                needs = [(s, "forward", i)] + ([(s + 1, "backward", i)] if s < pp - 1 else [])
            if all(n in done for n in needs):
                start = max([free[s]] + [done[n] for n in needs])
                done[(s, action, i)] = free[s] = start + 1
                actions.append(Action(s, action, i, start, start + 1))
                position[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule} deadlocks with pp={pp}, m={microbatches}")
    return actions


def idle_fraction(actions: list[Action]) -> dict[int, float]:
    """stage -> share of the step span in which it computes nothing."""
    span = max(a.end for a in actions) - min(a.start for a in actions)
    stages = sorted({a.stage for a in actions})
    return {s: 1 - sum(a.end - a.start for a in actions if a.stage == s) / span for s in stages}


def pipeline_concept(schedule: str = "1f1b", pp: int = 2, microbatches: int = 4):
    """The idealized schedule drawn as stages x time, microbatch numbers inside the bars, the idle
    share of each stage beside it (its grey gaps are the bubble)."""
    actions = ideal_pipeline(schedule, pp, microbatches)
    idle = idle_fraction(actions)
    fig = new_figure(10, 0.6 * pp + 1.7)
    ax = fig.add_subplot()
    ax.set_label("concept:pipeline")
    for a in actions:
        ax.barh(
            a.stage, 1, left=a.start, height=0.7, color=ACTION_COLORS[a.action], edgecolor="white", gid=f"pp:{a.action}"
        )
        ax.text(a.start + 0.5, a.stage, str(a.microbatch), ha="center", va="center", fontsize=8, color="white")
    span = max(a.end for a in actions)
    for s, share in idle.items():
        ax.text(span + 0.2, s, f"idle {share:.0%}", va="center", fontsize=8)
    ax.set_yticks(range(pp), [f"stage {s}" for s in range(pp)])
    ax.invert_yaxis()
    ax.set_xlim(0, span + 1.6)
    ax.set_xlabel("time (one forward or one backward = 1)")
    ax.legend(
        handles=[Patch(color=c, label=a) for a, c in ACTION_COLORS.items()],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
    )
    ax.set_title(
        f"{schedule}, idealized: p={pp} stages, m={microbatches} microbatches, bubble (p-1)/(m+p-1) = "
        f"{pp - 1}/{microbatches + pp - 1}",
        fontsize=10,
    )
    return fig
