"""What ``python -m launch plan`` prints: one plan (``launch.plan.build.Plan``) as text or JSON, and the
``--compare`` ranking of every layout of the same world size.

The tables go through ``launch.tables``; the ``--layouts`` review has its own renderer
(``launch.plan.review_page``). Torch is never imported here.
"""

from __future__ import annotations

from hyper_parallel.cost_model import ModelConfig
from hyper_parallel.cost_model.assumptions import assumptions as model_assumptions
from hyper_parallel.cost_model.hardware import DEFAULT_HARDWARE, Hardware
from hyper_parallel.cost_model.layouts import GIB, Bandwidth, fmt_bytes
from hyper_parallel.cost_model.pipeline import layer_ranges
from hyper_parallel.cost_model.ranking import RankedLayout
from hyper_parallel.cost_model.review import RESOLUTION, warnings_of
from hyper_parallel.cost_model.step_time import StepEstimate
from hyper_parallel.mesh import ParallelDims
from launch.plan.build import Plan


def _ranks(ranks: list[int]) -> str:
    if len(ranks) <= 8:
        return str(ranks)
    stride = ranks[1] - ranks[0]
    regular = all(b - a == stride for a, b in zip(ranks, ranks[1:]))
    shape = f"stride {stride}" if regular else "irregular"
    return f"[{ranks[0]}, {ranks[1]}, {ranks[2]}, ..., {ranks[-1]}] ({len(ranks)} ranks, {shape})"


def plan_json(plan: Plan, command: str) -> dict:
    """The plan as plain data (``plan --json``), for scripts and the plan widget."""
    cost = plan.cost
    return {
        "degrees": plan.dims.degrees(),
        "model": cost.config.name,
        "parameters": cost.parameter_count,
        "seq_len": cost.config.seq_len,
        "global_batch": cost.config.global_batch,
        "precision": cost.config.precision.name,
        "gpus_per_node": plan.gpus_per_node,
        "rank": plan.rank,
        "groups": plan.groups,
        "memory": cost.memory.as_dict(),
        "stage_memory": [
            {"pp_rank": s.pp_rank, "layers": [[c[0], c[-1]] if c else [] for c in s.chunks], "embedding": s.first}
            | {"head": s.last}
            | {"alive_microbatches": s.alive}
            | s.memory.as_dict()
            for s in cost.stages
        ],
        "pp_schedule": cost.config.pp_schedule,
        "virtual_stages": cost.config.virtual_stages,
        "communication": [c.__dict__ for c in plan.collectives],
        "comm_seconds": plan.comm_seconds,
        "step": _step_json(plan.step),
        "hardware": plan.hardware.name,
        "memory_budget_bytes": plan.hardware.budget_bytes,
        "fits": cost.memory.total <= plan.hardware.budget_bytes,
        "warnings": warnings_of(cost, plan.hardware, plan.gpus_per_node),
        "notes": list(cost.config.notes),
        "assumptions": assumptions(plan.cost.config, plan.bandwidth, plan.hardware),
        "command": command,
    }


def _step_json(step: StepEstimate) -> dict:
    return {
        "flops_per_rank": step.flops.total,
        "model_flops_per_rank": step.flops.model,
        "recompute_flops_per_rank": step.flops.recompute,
        "model_tflops_per_gpu": step.flops.model / step.seconds / 1e12,
        "seconds": step.seconds,
        "seconds_range": [step.fast.total, step.slow.total],
        "mfu": step.middle.mfu,
        "compute_seconds": step.middle.compute,
        "critical_seconds": step.middle.critical,
        "exposed_seconds": step.middle.exposed,
        "hidden_seconds": step.middle.hidden,
        "inter_node_bytes": step.inter_node_bytes,
        "bubble_seconds": step.bubble_seconds,
        "work_seconds": dict(step.middle.work.__dict__) if step.middle.work else {},
        "stage_seconds": list(step.stage_seconds),
    }


def compare_json(ranked: list[RankedLayout], top: int) -> list[dict]:
    """The first ``top`` layouts of ``--compare`` as the JSON document's ``compare`` list."""
    return [
        {
            "degrees": r.dims.degrees(),
            "memory_bytes": r.memory_bytes,
            "comm_seconds": r.comm_seconds,
            "step_seconds": r.step_seconds,
            "step_range": list(r.step_range),
            "mfu": r.mfu,
            "exposed_seconds": r.exposed_seconds,
            "bubble_seconds": r.bubble_seconds,
            "fits": r.fits,
            "choice": r.choice,
        }
        for r in ranked[:top]
    ]


def assumptions(config: ModelConfig, bandwidth: Bandwidth, hardware: Hardware = DEFAULT_HARDWARE) -> list[str]:
    """What the estimate takes for granted, in words (``cost_model.assumptions``, with the calibration
    sources): printed with every plan so no number stands alone. ``bandwidth`` is the hardware's."""
    return model_assumptions(config, hardware)


def print_plan(plan: Plan, command: str) -> None:
    """The plan as text: groups, memory per rank, collectives per step, step time, assumptions, command."""
    _print_layout(plan)
    _print_groups(plan)
    _print_memory(plan)
    _print_collectives(plan)
    _print_step(plan)
    print(
        "\nassumptions:\n"
        + "\n".join(f"  - {line}" for line in assumptions(plan.cost.config, plan.bandwidth, plan.hardware))
    )
    print(f"\nmulti-node command (run on every node):\n{command}")


def _print_layout(plan: Plan) -> None:
    """The model, the ranks and nodes it runs on, and the degrees found valid."""
    cost, dims = plan.cost, plan.dims
    nodes, per_node = max(1, dims.world_size // plan.gpus_per_node), min(plan.gpus_per_node, dims.world_size)
    print(f"plan: {cost.config.name} on {dims.world_size} ranks ({nodes} node(s) x {per_node})")
    print(f"  {cost.config.describe()}; {cost.parameter_count:.3g} parameters")
    print("valid: " + dims.describe())


def _print_groups(plan: Plan) -> None:
    """Each dim's groups as the DeviceMeshes built them, and which of them cross a node boundary."""
    print(f"\ngroups (read from DeviceMeshes on a fake process group; rank {plan.rank}'s group and the first group):")
    rows = [
        (
            dim,
            str(g["size"]),
            str(g["count"]),
            f"{g['nodes_spanned']}" + (" (crosses)" if g["nodes_spanned"] > 1 else ""),
            _ranks(g["rank_group"]),
            _ranks(g["first_groups"][0]),
        )
        for dim, g in plan.groups.items()
    ]
    _table(("dim", "size", "groups", "nodes/group", f"rank {plan.rank}'s group", "first group"), rows)
    crossing = [dim for dim, g in plan.groups.items() if g["nodes_spanned"] > 1]
    print(f"groups crossing node boundaries with {plan.gpus_per_node} GPUs per node: {', '.join(crossing) or 'none'}")


def _print_memory(plan: Plan) -> None:
    """Memory per rank against the budget, and under a pipeline each stage's."""
    cost, budget = plan.cost, plan.hardware.budget_bytes
    print(
        "\nmemory per rank"
        + (" (the worst pipeline stage's)" if cost.stages else "")
        + ": "
        + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in cost.memory.as_dict().items())
        + f" ({'within' if cost.memory.total <= budget else 'OVER'} the {budget / GIB:.1f} GiB budget)"
    )
    for s in cost.stages:
        print(
            f"  pp rank {s.pp_rank}: layers {layer_ranges(s.layers)}"
            + (" + embedding" if s.first else "")
            + (" + head" if s.last else "")
            + f", {s.alive:g} microbatch(es) in flight: {fmt_bytes(s.memory.total)}"
        )


def _print_collectives(plan: Plan) -> None:
    """Every collective of one step on every rank, and their time if nothing overlapped."""
    print("\ncommunication of one step on every rank:")
    rows = [
        (
            c.op,
            c.group,
            c.phase,
            str(c.count),
            fmt_bytes(c.bytes),
            fmt_bytes(c.wire_bytes),
            "yes" if c.crosses_nodes else "no",
            f"{c.seconds * 1e3:.2f}",
        )
        for c in plan.collectives
    ]
    _table(("op", "group", "phase", "calls", "bytes", "wire bytes", "crosses", "ms"), rows)
    print(f"total: {plan.comm_seconds * 1e3:.1f} ms per step if nothing overlapped")


def _print_step(plan: Plan) -> None:
    """The step's time and where it goes, the pipeline's stages, and the warnings and notes of the estimate."""
    cost, dims, step = plan.cost, plan.dims, plan.step
    print(
        f"\nstep: {step.flops.total / 1e12:.0f} TFLOP per rank ({step.flops.recompute / 1e12:.0f} recomputed), "
        f"{step.seconds:.2f} s ({step.fast.total:.2f}-{step.slow.total:.2f}), MFU {step.middle.mfu:.0%} "
        f"({step.flops.model / step.seconds / 1e12:.0f} model TFLOP/s per GPU): compute "
        f"{step.middle.compute:.2f} s, critical comm {step.middle.critical:.2f} s, exposed FSDP/HSDP "
        f"{step.middle.exposed:.2f} s, hidden {step.middle.hidden:.2f} s; {step.inter_node_bytes / GIB:.1f} GiB "
        f"per rank cross nodes" + (f"; pipeline bubble {step.bubble_seconds:.2f} s" if dims.pp > 1 else "")
    )
    if dims.pp > 1:
        from hyper_parallel.cost_model.pipeline import plan_lines

        print("\n" + "\n".join(plan_lines(cost.config, dims)))
    for warning in warnings_of(cost, plan.hardware, plan.gpus_per_node):
        print(f"WARNING: {warning}")
    for note in cost.config.notes:
        print(f"NOTE: {note}")


def ranks_with_ties(values: list[float]) -> list[str]:
    """Places of values sorted best first: a value within RESOLUTION of its group's first shares its place
    ("2=")."""
    places, leader, tied = [], 0, set()
    for index, value in enumerate(values):
        if index and value <= values[leader] * (1 + RESOLUTION):
            tied.update((leader, index))
        else:
            leader = index
        places.append(leader)
    return [f"{p + 1}=" if p in tied else str(p + 1) for p in places]


def fmt_seconds(seconds: float) -> str:
    """'1.41 s', '12.3 ms', '45.6 us': the recipes' tiny models step in microseconds, llama-8b in seconds."""
    if seconds >= 0.1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.3g} us"


def print_compare(ranked: list[RankedLayout], dims: ParallelDims, top: int, budget_bytes: float, sort: str) -> None:
    """The ``top`` layouts of the same world size, best first, with where ``dims`` ranks (``plan --compare``)."""
    mine = next((i for i, r in enumerate(ranked) if r.dims == dims), None)
    print(
        f"\n{len(ranked)} valid layouts of {dims.world_size} ranks, best first (within {budget_bytes / GIB:.1f} GiB "
        f"per rank first, then by {'step time' if sort == 'time' else 'memory'}; step times within "
        f"{RESOLUTION:.0%} share a place, '='):"
    )
    fitting = [r.step_seconds for r in ranked if r.fits] if sort == "time" else []
    places = (
        ranks_with_ties(fitting) + [str(i + 1) for i in range(len(fitting), len(ranked))]
        if fitting
        else [str(i + 1) for i in range(len(ranked))]
    )
    rows = []
    chosen = any(layout.choice for layout in ranked[:top])
    for index, layout in enumerate(ranked[:top]):
        low, high = layout.step_range
        rows.append(
            (
                places[index],
                layout.dims.label() + (f" [{layout.choice}]" if chosen and layout.choice else ""),
                fmt_bytes(layout.memory_bytes),
                f"{fmt_seconds(layout.step_seconds)} ({fmt_seconds(low)}-{fmt_seconds(high)})",
                f"{layout.mfu:.0%}",
                f"{layout.exposed_seconds * 1e3:.0f}",
                f"{layout.comm_seconds * 1e3:.1f}",
                "yes" if layout.fits else "no",
                "<- this plan" if index == mine else "",
            )
        )
    _table(
        ("#", "degrees", "memory/rank", "step (range)", "MFU", "exposed comm ms", "comm ms if serial", "fits", ""), rows
    )
    if mine is not None and mine >= top:
        print(f"this plan's layout is #{mine + 1}")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    from launch.tables import print_table

    print_table(header, rows)
