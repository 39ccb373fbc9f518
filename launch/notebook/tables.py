"""The HTML tables a notebook shows for run results (``launch.tables``), and the counts behind them.

    groupinfo_table(results)              per fully_shard unit: shard/dp/rank sizes, RS and AR groups
    collective_table(results)             collectives of the last step per (op, group)
    exposure_table(results)               per rank: communication in flight, exposed, hidden behind compute
    numbers_table(results)                loss per step against the single-process reference
    collective_counts(result)             (phase, op, group) -> count, for a notebook's own assertions
    gradient_reduction(shard, dp)         RS/AR decision of a fully_shard unit from its GroupInfo sizes
    ratio_verdict(row["ratio"])           whether a benchmark ratio is outside its quartile noise
    pipeline_reduction_text(result, m)    how often a pipeline run reduced its gradients, from its trace

``results`` maps a label to a RunResult (``launch.notebook.runs.run_recipes``); the notebooks import
these from here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any


def _decision(unit: Mapping[str, Any]) -> str:
    return gradient_reduction(unit["shard_size"], unit["dp_size"])


def gradient_reduction(shard: int, dp: int) -> str:
    """How a unit's gradients are reduced, from its GroupInfo sizes (the decision table of 07):
    ``RS(shard) + AR(dp)``, ``RS(shard)``, ``AR(dp)`` or ``no communication``."""
    if shard > 1:
        return f"RS({shard})" + (f" + AR({dp})" if dp > 1 else "")
    return f"AR({dp})" if dp > 1 else "no communication"


def groupinfo_table(results: Mapping[str, Any]):
    """One row per fully_shard unit of each run: GroupInfo sizes, groups and the RS/AR decision."""
    from launch.tables import table

    rows = []
    for label, result in results.items():
        for unit in result.metrics.get("units", []):
            rows.append(
                [
                    label,
                    unit["unit"],
                    unit["rank_size"],
                    unit["shard_size"],
                    unit["dp_size"],
                    f"{unit['sharded_group']['name'] or '-'} {unit['sharded_group']['ranks']}",
                    f"{unit['unsharded_group']['name'] or '-'} {unit['unsharded_group']['ranks']}",
                    _decision(unit),
                ]
            )
    return table(
        [
            "run",
            "unit",
            "rank_size",
            "shard_size",
            "dp_size",
            "sharded group (RS), rank 0's",
            "unsharded group (AR), rank 0's",
            "gradient reduction",
        ],
        rows,
        caption="GroupInfo per fully_shard unit (rank 0's view): rank_size = shard_size x dp_size",
    )


def collective_counts(result, step: int | None = None, rank: int = 0) -> Counter:
    """(phase, op, group) -> number of collectives rank ``rank`` issued in ``step`` (default: the last);
    ``result``: a RunResult or its traces ({rank: events})."""
    traces = result if isinstance(result, Mapping) else result.traces
    events = [e for e in traces.get(rank, []) if e.get("kind") == "collective" and e.get("phase") != "init"]
    if not events:
        return Counter()
    step = max(e["step"] for e in events) if step is None else step
    return Counter((e["phase"], e["op"], e["group"]) for e in events if e["step"] == step)


def collective_table(results: Mapping[str, Any], step: int | None = None):
    """Collectives of rank 0 in one step (default: the last) per run, phase, op and group."""
    from launch.tables import table

    rows = []
    for label, result in results.items():
        counts = collective_counts(result, step)
        for (phase, op, group), count in sorted(counts.items()):
            rows.append([label, phase, op, group, count])
        if not counts:
            rows.append([label, "-", "no collectives", "-", 0])
    return table(["run", "phase", "op", "group", "count"], rows, caption="collectives of rank 0 in the last step")


def exposure_table(results: Mapping[str, Any], step: int | None = None):
    """Per run and rank: ms of the step with a collective in flight, of those with no compute running
    (exposed), and hidden behind compute (``hyper_parallel.viz.overlap``)."""
    from hyper_parallel.viz.overlap import exposure
    from hyper_parallel.viz.timeline import steps_of
    from launch.tables import table

    rows = []
    for label, result in results.items():
        chosen = steps_of(result.traces)[-1] if step is None else step
        for rank, numbers in exposure(result.traces, chosen).items():
            rows.append(
                [
                    label,
                    rank,
                    f"{numbers['compute'] * 1e3:.1f}",
                    f"{numbers['in_flight'] * 1e3:.1f}",
                    f"{numbers['exposed'] * 1e3:.1f}",
                    f"{numbers['hidden'] * 1e3:.1f}",
                ]
            )
    return table(["run", "rank", "compute ms", "communication in flight ms", "exposed ms", "hidden ms"], rows)


def numbers_table(results: Mapping[str, Any]):
    """Loss per step of each run next to its single-process reference."""
    from launch.tables import table

    rows = []
    for label, result in results.items():
        losses, reference = result.metrics.get("losses", []), result.metrics.get("reference_losses", [])
        for step, (loss, ref) in enumerate(zip(losses, reference)):
            rows.append([label, step, f"{loss:.8f}", f"{ref:.8f}", f"{abs(loss - ref):.2e}"])
        rows.append(
            [
                label,
                "params",
                "",
                "",
                f"{result.metrics.get('max_param_diff', float('nan')):.2e}"
                + ("" if result.ok else "  ✘ " + ", ".join(result.metrics.get("mismatched_params", []))),
            ]
        )
    return table(
        ["run", "step", "loss", "single-process reference", "|difference|"],
        rows,
        caption="every step against the reference; 'params': max |param - reference| after the last step",
    )


def ratio_verdict(ratio: Mapping[str, float]) -> str:
    """What a benchmark's ours / torch step-time ratio says: a quartile range that contains 1 is inside
    the pairs' noise (no measurable difference on this machine); otherwise which side is faster."""
    q1, median, q3 = ratio["q1"], ratio["median"], ratio["q3"]
    if q1 <= 1.0 <= q3:
        return (
            f"{median:.2f} [{q1:.2f}-{q3:.2f}]: the quartiles contain 1.00, within the noise: no measurable difference"
        )
    side = "ours slower" if q1 > 1.0 else "ours faster"
    return f"{median:.2f} [{q1:.2f}-{q3:.2f}]: {side} in at least three quarters of the pairs"


def gradient_reductions(result, rank: int = 0) -> dict[str, int]:
    """How often rank ``rank`` reduce-scattered its gradients on fsdp in the last step, over how many
    units (the distinct ``module`` labels of those reduce-scatters): ``per_unit`` is 1 when each unit
    reduces once per step, the number of microbatches when it reduces after every microbatch."""
    traces = result if isinstance(result, Mapping) else result.traces
    events = [e for e in traces.get(rank, []) if e.get("kind") == "collective" and e.get("phase") != "init"]
    if not events:
        raise ValueError(f"rank {rank} traced no collectives")
    last = max(e["step"] for e in events)
    scatters = [e for e in events if e["step"] == last and (e["op"], e["group"]) == ("reduce_scatter", "fsdp")]
    units = len({e["module"] for e in scatters})
    return {"reduce_scatters": len(scatters), "units": units, "per_unit": len(scatters) // units if units else 0}


def pipeline_reduction_text(result, microbatches: int, rank: int = 0) -> str:
    """What the trace says about a pipeline's gradient reduction, in a sentence a learner can check."""
    counts = gradient_reductions(result, rank)
    n, units, per_unit = counts["reduce_scatters"], counts["units"], counts["per_unit"]
    head = f"rank {rank} reduce-scattered its gradients {n} times on fsdp in the last step, over {units} units: "
    if per_unit == 1:
        return head + (
            f"once per unit and step. The schedule held the gradients of the first {microbatches - 1} microbatches "
            "and reduced their sum after the last one (as torchtitan does): the same gradient traffic as without PP."
        )
    if per_unit == microbatches:
        return head + (
            f"once per unit and microbatch ({microbatches} x {units}): {microbatches}x the gradient traffic. The "
            "schedule did not defer the reduction to the last microbatch; that is not the CPU, a GPU run would do the same."
        )
    return head + f"{per_unit} per unit, neither once per step nor once per microbatch ({microbatches})."


def schedule_table(results: Mapping[str, Any], step: int | None = None):
    """One row per pipeline run: its schedule, stages per rank, microbatches, the measured bubble (mean idle
    fraction over the ranks, ``viz.pipeline.measured_bubble``) and the cost model's formula for it."""
    from hyper_parallel.viz.pipeline import formula_text, measured_bubble
    from launch.tables import table

    rows = []
    for label, result in results.items():
        notes, dims = result.metrics["notes"], result.dims
        last = max(e["step"] for events in result.traces.values() for e in events if e.get("kind") == "pipeline")
        bubble = measured_bubble(result.traces, last if step is None else step)
        mean = sum(bubble.values()) / len(bubble)
        spr, m = notes["stages_per_rank"], notes["microbatches"]
        rows.append(
            [label, notes["schedule"], dims.pp, spr, m, f"{mean:.0%}", formula_text(notes["schedule"], dims.pp, m, spr)]
        )
    return table(["run", "schedule", "pp", "stages/rank", "microbatches", "measured bubble", "formula"], rows)


def gathered_per_step(result, rank: int = 0, step: int | None = None) -> dict[str, int]:
    """A pipeline run's fully_shard all-gathers in one step on ``rank`` (all phases) and the parameter
    bytes its stages held gathered after each action: after the first one and at the peak."""
    counts = collective_counts(result, step, rank)
    actions = [e for e in result.traces[rank] if e.get("kind") == "pipeline"]
    last = max(e["step"] for e in actions) if step is None else step
    held = [e["gathered_bytes"] for e in actions if e["step"] == last]
    return {
        "all_gathers": sum(n for (_, op, group), n in counts.items() if op == "all_gather" and group == "fsdp"),
        "after_first_action": held[0],
        "peak": max(held),
    }


def reshard_table(results: Mapping[str, Any], rank: int = 0):
    """fully_shard under PP, reshard after forward or not: per run, rank ``rank``'s all-gathers per step and
    the bytes its stage held gathered after its first forward and at the peak (``gathered_per_step``)."""
    from launch.tables import table

    rows = []
    for label, result in results.items():
        counts = gathered_per_step(result, rank)
        rows.append([label, counts["all_gathers"], counts["after_first_action"], counts["peak"]])
    return table(
        ["run", f"all-gathers per step, rank {rank}", "gathered after the first forward (B)", "peak gathered (B)"], rows
    )


def traced_and_model_bytes(result, groups: tuple[str, ...], rank: int = 0, step: int | None = None) -> list[list]:
    """Rank ``rank``'s traced bytes per (op, group, phase) on ``groups`` in one step (default: the last),
    beside the cost model's for the same run (``cost_model.recipe_model``): rows [op, group, phase, traced,
    model], one per collective the cost model expects on those groups."""
    from hyper_parallel.cost_model import estimate, recipe_model

    events = [e for e in result.traces[rank] if e.get("kind") == "collective" and e["group"] in groups]
    last = max(e["step"] for e in events) if step is None else step
    traced: Counter = Counter()
    for event in events:
        if event["step"] == last:
            traced[(event["op"], event["group"], event["phase"])] += event["bytes"]
    model = estimate(recipe_model(result.metrics["recipe"], result.metrics["options"]), result.dims)
    return [
        [c.op, c.group, c.phase, traced[(c.op, c.group, c.phase)], int(c.bytes)]
        for c in model.collectives
        if c.group in groups
    ]


def model_bytes_table(result, groups: tuple[str, ...], rank: int = 0, step: int | None = None):
    """``traced_and_model_bytes`` as a table."""
    from launch.tables import table

    rows = traced_and_model_bytes(result, groups, rank, step)
    return table(["op", "group", "phase", f"traced bytes, rank {rank}", "cost model bytes"], rows)


def forward_gathers(result, rank: int = 0, step: int | None = None) -> dict[str, tuple[int, str]]:
    """``unit -> (bytes, dtype)`` of each fully_shard unit's forward all-gather on ``rank`` in one step
    (default: the last): the buffer as it moves (float8 weights travel as uint8 bytes beside float32 norms)."""
    events = [e for e in result.traces[rank] if e.get("kind") == "collective" and e["op"] == "all_gather"]
    last = max(e["step"] for e in events) if step is None else step
    return {
        e["module"]: (e["bytes"], e["dtype"])
        for e in events
        if e["step"] == last and e["phase"] == "forward" and e["group"] == "fsdp"
    }


def gather_bytes_table(results: Mapping[str, Any], rank: int = 0):
    """Each unit's forward all-gather bytes per run side by side, and their ratio to the first run's
    (M4 against M4-F8: what float8 all-gather saves, unit by unit)."""
    from launch.tables import table

    gathers = {label: forward_gathers(result, rank) for label, result in results.items()}
    first = next(iter(gathers.values()))
    rows = [
        [
            unit,
            *(f"{g[unit][0]:,} B ({g[unit][1]})" for g in gathers.values()),
            *(f"{g[unit][0] / first[unit][0]:.3f}" for g in list(gathers.values())[1:]),
        ]
        for unit in first
    ]
    labels = list(gathers)
    return table(
        ["unit", *labels, *(f"{label} / {labels[0]}" for label in labels[1:])],
        rows,
        caption=f"forward all-gathers of rank {rank} in the last step",
    )
