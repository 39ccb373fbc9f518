"""The pipeline schedule of one step as it ran: per rank, a bar per microbatch's forward and backward on
each stage (the microbatch number inside; zero-bubble schedules' backward split into B, the input
gradient, and W, the weight gradient), and the measured bubble beside the formula.

Drawn from the ``"pipeline"`` events TracedPipelineStage records. All ranks of one machine share one
clock (trace times are seconds since rank 0's epoch), so bars of different ranks line up. The measured
bubble of a rank is the part of the step span (first action of any rank to last action of any rank)
in which that rank computed nothing: waiting for a microbatch from a neighbour, or for its gradient.
The formula assumes equal stages and free communication; on a loaded CPU the measurement also holds
the P2P and the uneven stages (the first has the embedding, the last the head and the loss).
"""

from __future__ import annotations

from typing import Any

import matplotlib
from matplotlib.patches import Patch

from hyper_parallel.cost_model.pipeline import bubble_fraction, get_schedule
from hyper_parallel.viz.style import new_figure

Traces = dict[int, list[dict[str, Any]]]
ACTION_COLORS = {
    "forward": "#4c72b0",
    "backward": "#dd8452",
    "backward_input": "#c44e52",
    "backward_weight": "#55a868",
}
ACTION_NAMES = {
    "forward": "F forward",
    "backward": "backward (input and weight gradients)",
    "backward_input": "B input gradient",
    "backward_weight": "W weight gradient",
}


def pipeline_events(traces: Traces, step: int) -> dict[int, list[dict]]:
    """rank -> its forward/backward actions of ``step``, in time order."""
    events = {
        rank: sorted((e for e in evs if e.get("kind") == "pipeline" and e["step"] == step), key=lambda e: e["t_start"])
        for rank, evs in sorted(traces.items())
    }
    if not any(events.values()):
        steps = sorted({e["step"] for evs in traces.values() for e in evs if e.get("kind") == "pipeline"})
        raise ValueError(
            f"no pipeline actions in step {step}; steps with pipeline actions: {steps} "
            "(a run of a pipeline recipe, P1/P2, records them)"
        )
    return events


def measured_bubble(traces: Traces, step: int) -> dict[int, float]:
    """rank -> idle fraction of the step span (module docstring)."""
    events = pipeline_events(traces, step)
    start = min(e["t_start"] for evs in events.values() for e in evs)
    end = max(e["t_end"] for evs in events.values() for e in evs)
    return {rank: 1.0 - sum(e["t_end"] - e["t_start"] for e in evs) / (end - start) for rank, evs in events.items()}


def row_label(rank: int, events: list[dict]) -> str:
    """ "stage s · rank r" (the text speaks in stages, the trace in ranks); interleaved "stages 0, 2 · rank r"."""
    stages = sorted({e["stage"] for e in events})
    return f"stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))} · rank {rank}"


def pipeline_schedule(
    traces: Traces,
    step: int = 1,
    schedule: str | None = None,
    microbatches: int | None = None,
    pp: int | None = None,
    stages_per_rank: int = 1,
    title: str | None = None,
):
    """Per-rank schedule of ``step``; with ``schedule`` (and the degrees, else read from the events) the
    title compares the mean measured bubble with the formula."""
    events = pipeline_events(traces, step)
    bubble = measured_bubble(traces, step)
    start = min(e["t_start"] for evs in events.values() for e in evs)
    span = max(e["t_end"] for evs in events.values() for e in evs) - start
    ranks = list(events)
    stages = sorted({e["stage"] for evs in events.values() for e in evs})
    microbatches = microbatches or len({e["microbatch"] for evs in events.values() for e in evs})
    n_pp = pp or len(stages) // stages_per_rank
    fig = new_figure(11, 0.55 * len(ranks) + 1.6)
    ax = fig.add_subplot()
    for row, rank in enumerate(ranks):
        for e in events[rank]:
            x, width = (e["t_start"] - start) * 1e3, (e["t_end"] - e["t_start"]) * 1e3
            # interleaved: a rank's second-round stage (stage >= pp) drawn paler
            color = matplotlib.colors.to_rgba(ACTION_COLORS[e["action"]], 1.0 if e["stage"] < n_pp else 0.55)
            ax.barh(row, width, left=x, height=0.7, color=color, edgecolor="white", linewidth=0.5)
            label = str(e["microbatch"]) if stages_per_rank == 1 else f"{e['microbatch']}s{e['stage']}"
            ax.text(x + width / 2, row, label, ha="center", va="center", fontsize=7, color="white", clip_on=True)
        ax.text(span * 1e3 * 1.01, row, f"idle {bubble[rank]:.0%}", va="center", fontsize=8)
    ax.set_yticks(range(len(ranks)), [row_label(r, events[r]) for r in ranks])
    ax.invert_yaxis()
    ax.set_xlim(0, span * 1e3 * 1.12)
    ax.set_xlabel("ms since the step's first action")
    shown = {e["action"] for evs in events.values() for e in evs}
    ax.legend(  # outside the axes: it never covers a bar
        handles=[Patch(color=c, label=ACTION_NAMES[a]) for a, c in ACTION_COLORS.items() if a in shown],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
    )
    mean = sum(bubble.values()) / len(bubble)
    text = f"measured bubble {mean:.0%} (mean over ranks)"
    if schedule is not None:
        text += f" · formula {formula_text(schedule, n_pp, microbatches, stages_per_rank)}"
    ax.set_title(f"{title or schedule or 'pipeline'}: pp={n_pp}, m={microbatches} microbatches\n{text}", fontsize=10)
    return fig


def formula_text(schedule: str, pp: int, microbatches: int, stages_per_rank: int = 1) -> str:
    """The schedule's bubble formula with its numbers, e.g. "(p-1)/(m+p-1) = 1/5 = 20%" or, for the
    zero-bubble schedules, "b/(m+b), b = (p-1)/6 = 0.17: 4%" (``cost_model.pipeline``)."""
    value = bubble_fraction(schedule, pp, microbatches, stages_per_rank)
    slots = get_schedule(schedule).bubble_per_hop
    if slots != 1.0:
        share = round(1 / slots)
        return f"b/(m+b), b = (p-1)/{share} = {(pp - 1) * slots:.2f} slots: {value:.0%}"
    v = f"{stages_per_rank}*" if stages_per_rank > 1 else ""
    return f"(p-1)/({v}m+p-1) = {pp - 1}/{stages_per_rank * microbatches + pp - 1} = {value:.0%}"
