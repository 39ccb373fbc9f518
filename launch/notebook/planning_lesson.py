"""Notebook 11's procedure for choosing degrees, the Ultra-Scale Playbook's three steps on the planner:

1. fit memory: the training state and the activations of one step within the GPU's budget;
2. reach the global batch: every data-parallel rank loads a whole number of sequences, so
   ``dp = world / (tp * cp * pp)`` must divide the global batch: at scale this, not memory, is often
   what forces model parallelism;
3. maximise throughput: among the layouts left, the fastest step (``rank_layouts``' order).

``procedure_rows`` walks the model-parallel degrees a node holds (tp, cp) and pp, one row per choice with
the step that rules it out; the layouts the planner ranks are the same ones (``ranking.rank_layouts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hyper_parallel.cost_model import ModelConfig, estimate
from hyper_parallel.cost_model.ranking import RankedLayout
from hyper_parallel.mesh import ParallelDims


@dataclass(frozen=True)
class ProcedureRow:
    """One model-parallel choice (the rest of the world shards the data) and the first step it fails."""

    tp: int
    cp: int
    pp: int
    dp: int
    sequences_per_dp_rank: float
    memory_bytes: int | None  # None: no layout (the global batch or the shapes refuse it)
    step_seconds: float | None
    verdict: str  # "fails step 1 (memory)", "fails step 2 (global batch)", "a candidate", "fails: <rule>"


def procedure_rows(
    config: ModelConfig, world_size: int, ranked: Sequence[RankedLayout], gpus_per_node: int
) -> list[ProcedureRow]:
    """One row per (tp, cp, pp) with tp * cp within a node and pp in {1, 2}, FSDP over every other rank;
    memory and step time from the ranking the planner computed (``ranked``), else from ``estimate``."""
    by_dims = {r.dims: r for r in ranked}
    rows = []
    for pp in (1, 2):
        for cp in (1, 2):
            for tp in (t for t in (1, 2, 4, 8) if t * cp <= gpus_per_node):
                rows.append(_row(config, world_size, tp, cp, pp, by_dims))
    return [row for row in rows if row is not None]


def _row(config, world_size, tp, cp, pp, by_dims) -> ProcedureRow | None:
    model_parallel = tp * cp * pp
    if world_size % model_parallel:
        return None
    dp = world_size // model_parallel
    sequences = config.global_batch / dp
    if config.global_batch % dp:
        return ProcedureRow(tp, cp, pp, dp, sequences, None, None, "fails step 2 (global batch)")
    try:
        dims = ParallelDims(world_size=world_size, dp_shard=dp, cp=cp, tp=tp, pp=pp)
    except ValueError as error:
        return ProcedureRow(tp, cp, pp, dp, sequences, None, None, f"fails: {error}")
    ranked = by_dims.get(dims)
    if ranked is None:
        try:
            estimate(config, dims)
        except ValueError as error:
            rule = "fewer microbatches than stages" if "microbatches" in str(error) else str(error).split(";")[0]
            return ProcedureRow(tp, cp, pp, dp, sequences, None, None, f"fails step 2 ({rule})")
        return None  # the model's stack does not run this layout (``rank_layouts`` leaves it out)
    verdict = "a candidate" if ranked.fits else "fails step 1 (memory)"
    return ProcedureRow(tp, cp, pp, dp, sequences, ranked.memory_bytes, ranked.step_seconds, verdict)
