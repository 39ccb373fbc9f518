"""What the cost model says about a run: the bytes of every collective it traced, and its layout at scale.

    predicted_bytes(run)     (op, group) -> bytes of one step on one rank, both phases, from
                             ``estimate(recipe_model(recipe), dims)``: FSDP, HSDP, TP/SP, CP and EP alike (the
                             model equals the traces exactly for the recipes, tests/test_cost_model.py; EP's
                             all-to-all and ETP's all-reduce are the balanced value, exact summed over ranks)
    volume_rows(run)         rank 0's measured bytes per (op, group) beside the prediction and fully_shard's
                             minimum (the communication-volume figure's numbers; the report's and compare's table)
    at_scale(run, 512)       the run's layout grown to N ranks for the matching model at scale (a dense recipe:
                             llama-8b-like, a MoE one: moe-16e): the same cp, tp, ep, etp; with HSDP the same
                             dp_shard and more replicas, otherwise a wider dp_shard. Costed and timed by
                             ``cost_model.review`` on ``hardware.DEFAULT_HARDWARE``.
Torch is never imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyper_parallel.cost_model import estimate, get_model, recipe_model
from hyper_parallel.cost_model.hardware import DEFAULT_HARDWARE
from hyper_parallel.cost_model.review import CandidateReview, review_layouts
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.run_files import load_traces
from launch.report.run_data import RunData

AT_SCALE_WORLD = 512
GPUS_PER_NODE = 8


def predicted_bytes(run: RunData) -> dict[tuple[str, str], float] | None:
    """The cost model's bytes per (op, group) of one step on one rank, or None when it does not describe
    the run (unknown recipe, degrees missing or invalid)."""
    try:
        config = recipe_model(run.recipe_name or "", run.metrics.get("options"))
        return estimate(config, ParallelDims(**run.degrees)).by_op_group()
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True)
class AtScale:
    model: str
    world_size: int
    review: CandidateReview | None
    error: str | None
    command: str


def scaled_degrees(dims: ParallelDims, world_size: int) -> dict[str, int]:
    """The module docstring's rule: model-parallel degrees kept, the data-parallel dims fill the world."""
    degrees = {k: getattr(dims, k) for k in (MeshDim.CP, MeshDim.TP, MeshDim.EP, MeshDim.ETP) if getattr(dims, k) > 1}
    if dims.dp_replicate > 1 and dims.dp_shard > 1:
        degrees[MeshDim.DP_SHARD] = dims.dp_shard
        degrees[MeshDim.DP_REPLICATE] = world_size // (dims.dp_shard * dims.cp * dims.tp)
    return degrees


def at_scale(run: RunData, world_size: int = AT_SCALE_WORLD, gpus_per_node: int = GPUS_PER_NODE) -> AtScale | None:
    """The run's layout on ``world_size`` ranks (module docstring), or None without a known recipe."""
    try:
        dims = ParallelDims(**run.degrees)
        moe = recipe_model(run.recipe_name or "").is_moe
    except (ValueError, TypeError):
        return None
    model = "moe-16e" if moe else "llama-8b-like"
    degrees = scaled_degrees(dims, world_size)
    text = ",".join(f"{k}={v}" for k, v in degrees.items()) or f"dp_shard={world_size}"
    command = (
        f"python -m launch plan --world {world_size} --model {model} --gpus-per-node {gpus_per_node} "
        f'--layouts "{text}" --format md'
    )
    try:
        layout = ParallelDims(world_size=world_size, **degrees)
        review = review_layouts(get_model(model), [layout], gpus_per_node, DEFAULT_HARDWARE)[0]
    except ValueError as error:
        return AtScale(model, world_size, None, str(error), command)
    return AtScale(model, world_size, review, None, command)


def at_scale_sentence(scaled: AtScale) -> str:
    if scaled.review is None:
        return f"{scaled.model} on {scaled.world_size} ranks with these degrees: not a valid layout ({scaled.error})"
    r = scaled.review
    step, memory = r.step, r.cost.memory.total / 2**30
    budget = "within" if r.fits else "OVER"
    return (
        f"{scaled.model} on {scaled.world_size} ranks as {r.cost.dims.label()}: {memory:.1f} GiB per GPU "
        f"({budget} the {DEFAULT_HARDWARE.budget_bytes / 2**30:.1f} GiB budget), {step.seconds:.2f} s per step "
        f"({step.fast.total:.2f}-{step.slow.total:.2f}), MFU {step.middle.mfu:.0%}, exposed communication "
        f"{step.middle.exposed + step.middle.critical:.2f} s on {DEFAULT_HARDWARE.name}"
    )


def volume_rows(run: RunData) -> list[dict] | None:
    """Rank 0's bytes per (op, group) in the last step next to the cost model's prediction (every op) and
    fully_shard's minimum (the figure's numbers, FSDP/HSDP only)."""
    from hyper_parallel.viz.timeline import steps_of
    from hyper_parallel.viz.volume import measured_bytes, theoretical_bytes

    traces = load_traces(run.run_dir) if run.trace_ranks else {}
    steps = steps_of(traces) if 0 in traces else []
    if not steps:
        return None
    measured, counts = measured_bytes(traces, steps[-1], 0)
    minimum = theoretical_bytes(run.metrics.get("units", []))
    predicted = predicted_bytes(run) or {}
    keys = sorted(minimum) + sorted((set(measured) | set(predicted)) - set(minimum))
    return [
        {
            "op": op,
            "group": group,
            "calls": counts.get((op, group), 0),
            "measured": measured.get((op, group)),
            "predicted": predicted.get((op, group)),
            "minimum": minimum.get((op, group)),
        }
        for op, group in keys
    ]
