"""The idealized training step as data: the slots of one rank's step, in order, for the recipes' models.

    ideal_schedule(2, shard=True)       the slots of one idealized training step (one rank, nothing
                                        overlaps, every collective instantaneous in its place)
    schedule_counts(schedule)           (op, group, phase) -> number of collectives
    cp_chunks(cp)                       which sequence chunks every cp rank holds (i and 2cp-1-i)

Separate from the figures that draw it (``hyper_parallel.viz.concepts``): this module is plain data and
draws nothing (importing it through ``hyper_parallel.viz`` still loads matplotlib, as the package does).
tests/test_concepts.py holds its counts equal to the cost model's (``hyper_parallel.cost_model``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hyper_parallel.mesh_dims import UNSHARDED_DP_GROUP, MeshDim


@dataclass(frozen=True)
class Slot:
    """One thing an idealized rank does: a compute step (op None) or a collective on a group."""

    phase: str  # "forward" or "backward"
    what: str  # what computes, or what the collective moves
    op: str | None = None
    group: str | None = None


def cp_chunks(cp: int) -> dict[int, tuple[int, int]]:
    """The sequence in 2*cp chunks; cp rank i holds chunks i and 2cp-1-i, so under the causal mask
    every rank attends over the same number of (query chunk, key chunk) blocks."""
    if cp < 1:
        raise ValueError(f"cp must be >= 1, got {cp}")
    return {i: (i, 2 * cp - 1 - i) for i in range(cp)}


def ideal_schedule(
    n_layers: int = 2,
    *,
    model: str = "transformer",
    shard: bool = True,
    replicate: bool = False,
    tp: bool = False,
    sp: bool = False,
    cp: bool = False,
    moe_layers: tuple[int, ...] = (),
    expert_shard: bool = True,
    root: bool = True,
) -> list[Slot]:
    """The slots of one training step of one rank, in order, for the recipes' models.

    Units as the recipes build them: one per block (``model="mlp"``) or transformer layer, the root
    (embeddings / input projection, final norm, head) another; a MoE layer's experts are a unit of
    their own on ``efsdp``. ``shard``: FSDP all-gathers every unit before it computes (again in
    backward, except the root, which keeps its parameters) and reduce-scatters its gradients;
    ``replicate``: one all-reduce per unit on the replica group (DDP when not sharded, HSDP's
    second step when sharded). ``tp``/``sp``/``cp``: the activation collectives of Megatron-style
    TP, sequence parallelism and K/V all-gather context parallelism. ``root=False`` leaves out the
    root's slots (one layer on its own, as ``concept_figure`` draws it).
    """
    if model not in ("mlp", "transformer"):
        raise ValueError(f"model must be 'mlp' or 'transformer', got {model!r}")
    if sp and not tp:
        raise ValueError("sequence parallelism (sp) needs tp")
    ar_group = MeshDim.DP_REPLICATE if shard else UNSHARDED_DP_GROUP
    fwd, bwd = [], []

    def unit_grads(unit: str, shard_group: str = "fsdp", replica_group: str = ar_group, partial: bool = sp):
        if shard:
            bwd.append(Slot("backward", f"gradients of {unit}", "reduce_scatter", shard_group))
        if replicate:
            bwd.append(Slot("backward", f"gradient {'shard ' if shard else ''}of {unit}", "all_reduce", replica_group))
        if partial:
            bwd.append(Slot("backward", f"partial norm gradients of {unit}", "all_reduce", "tp"))

    if root and shard:
        fwd.append(Slot("forward", "root parameters (kept until backward)", "all_gather", "fsdp"))
    if root:
        fwd.append(Slot("forward", "input projection" if model == "mlp" else "embedding"))
        if tp:
            fwd.append(Slot("forward", "embedding output", "reduce_scatter" if sp else "all_reduce", "tp"))
    for layer in range(n_layers):
        name = f"{'block' if model == 'mlp' else 'layer'} {layer}"
        if shard:
            fwd.append(Slot("forward", f"{name} parameters", "all_gather", "fsdp"))
        if model == "mlp":
            fwd.append(Slot("forward", name))
            continue
        if sp:
            fwd.append(Slot("forward", "attention input (whole sequence)", "all_gather", "tp"))
        if cp:
            fwd.append(Slot("forward", "K/V of the other sequence chunks", "all_gather", "cp"))
        fwd.append(Slot("forward", f"attention {layer}"))
        if tp:
            fwd.append(Slot("forward", "wo's partial output", "reduce_scatter" if sp else "all_reduce", "tp"))
        if layer in moe_layers:
            if expert_shard:
                fwd.append(Slot("forward", "expert parameters", "all_gather", "efsdp"))
            fwd += [
                Slot("forward", "token counts per expert", "all_to_all", "ep"),
                Slot("forward", "dispatch tokens to their experts", "all_to_all", "ep"),
                Slot("forward", f"experts {layer}"),
                Slot("forward", "combine expert outputs", "all_to_all", "ep"),
            ]
            continue
        if sp:
            fwd.append(Slot("forward", "feed-forward input (whole sequence)", "all_gather", "tp"))
        fwd.append(Slot("forward", f"feed-forward {layer}"))
        if tp:
            fwd.append(Slot("forward", "w2's partial output", "reduce_scatter" if sp else "all_reduce", "tp"))
    if root:
        if sp:
            fwd.append(Slot("forward", "head input (whole sequence)", "all_gather", "tp"))
        fwd.append(Slot("forward", "head + loss"))
        if tp:
            fwd.append(Slot("forward", "logits (vocabulary shards)", "all_gather", "tp"))
        bwd.append(Slot("backward", "head + loss"))
        if tp:
            bwd.append(Slot("backward", "head input gradient", "reduce_scatter" if sp else "all_reduce", "tp"))
    for layer in reversed(range(n_layers)):
        name = f"{'block' if model == 'mlp' else 'layer'} {layer}"
        if shard:
            bwd.append(Slot("backward", f"{name} parameters again (resharded after forward)", "all_gather", "fsdp"))
        if model == "transformer" and layer in moe_layers:
            bwd.append(Slot("backward", "combine gradient", "all_to_all", "ep"))
            if expert_shard:
                bwd.append(Slot("backward", "expert parameters again", "all_gather", "efsdp"))
            bwd += [Slot("backward", f"experts {layer}"), Slot("backward", "dispatch gradient", "all_to_all", "ep")]
            if expert_shard:
                bwd.append(Slot("backward", "expert gradients", "reduce_scatter", "efsdp"))
        elif model == "transformer":
            if sp:
                bwd.append(Slot("backward", "w2 output gradient", "all_gather", "tp"))
            bwd.append(Slot("backward", f"feed-forward {layer}"))
            if tp:
                bwd.append(
                    Slot("backward", "feed-forward input gradient", "reduce_scatter" if sp else "all_reduce", "tp")
                )
        if model == "mlp":
            bwd.append(Slot("backward", name))
        else:
            if sp:
                bwd.append(Slot("backward", "wo output gradient", "all_gather", "tp"))
            bwd.append(Slot("backward", f"attention {layer}"))
            if cp:
                bwd.append(Slot("backward", "K/V gradients back to their chunks", "reduce_scatter", "cp"))
            if tp:  # wq, wk, wv's partial input gradients summed first: one collective per block input
                bwd.append(Slot("backward", "attention input gradient", "reduce_scatter" if sp else "all_reduce", "tp"))
        unit_grads(name)
    if root:
        if sp:
            bwd.append(Slot("backward", "embedding output gradient", "all_gather", "tp"))
        bwd.append(Slot("backward", "input projection" if model == "mlp" else "embedding"))
        unit_grads("root")
    return fwd + bwd


def schedule_counts(schedule: list[Slot]) -> Counter:
    """(op, group, phase) -> number of collectives: the cost model's ``CostEstimate.counts()`` keys."""
    return Counter((s.op, s.group, s.phase) for s in schedule if s.op is not None)
