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


@dataclass(frozen=True)
class _Styles:
    """The parallel styles of one idealized step (``ideal_schedule``'s arguments)."""

    model: str
    shard: bool
    replicate: bool
    tp: bool
    sp: bool
    cp: bool
    moe_layers: tuple[int, ...]
    expert_shard: bool

    @property
    def tp_op(self) -> str:
        """What a TP block's partial output (or input gradient) needs: reduce-scatter under SP, else all-reduce."""
        return "reduce_scatter" if self.sp else "all_reduce"

    def unit(self, layer: int) -> str:
        return f"{'block' if self.model == 'mlp' else 'layer'} {layer}"


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
    styles = _Styles(model, shard, replicate, tp, sp, cp, tuple(moe_layers), expert_shard)
    fwd = _root_forward(styles) if root else []
    bwd: list[Slot] = []
    for layer in range(n_layers):
        fwd += _layer_forward(styles, layer)
    if root:
        fwd += _head_forward(styles)
        bwd += [Slot("backward", "head + loss")]
        bwd += [Slot("backward", "head input gradient", styles.tp_op, "tp")] if tp else []
    for layer in reversed(range(n_layers)):
        bwd += _layer_backward(styles, layer) + _unit_gradients(styles, styles.unit(layer))
    if root:
        bwd += [Slot("backward", "embedding output gradient", "all_gather", "tp")] if sp else []
        bwd += [Slot("backward", "input projection" if model == "mlp" else "embedding")]
        bwd += _unit_gradients(styles, "root")
    return fwd + bwd


def _root_forward(styles: _Styles) -> list[Slot]:
    slots = [Slot("forward", "root parameters (kept until backward)", "all_gather", "fsdp")] if styles.shard else []
    slots.append(Slot("forward", "input projection" if styles.model == "mlp" else "embedding"))
    if styles.tp:
        slots.append(Slot("forward", "embedding output", styles.tp_op, "tp"))
    return slots


def _layer_forward(styles: _Styles, layer: int) -> list[Slot]:
    """A block or transformer layer's forward: its gather, attention (with SP / CP), then its feed-forward
    or its MoE."""
    name = styles.unit(layer)
    slots = [Slot("forward", f"{name} parameters", "all_gather", "fsdp")] if styles.shard else []
    if styles.model == "mlp":
        return slots + [Slot("forward", name)]
    if styles.sp:
        slots.append(Slot("forward", "attention input (whole sequence)", "all_gather", "tp"))
    if styles.cp:
        slots.append(Slot("forward", "K/V of the other sequence chunks", "all_gather", "cp"))
    slots.append(Slot("forward", f"attention {layer}"))
    if styles.tp:
        slots.append(Slot("forward", "wo's partial output", styles.tp_op, "tp"))
    if layer in styles.moe_layers:
        if styles.expert_shard:
            slots.append(Slot("forward", "expert parameters", "all_gather", "efsdp"))
        return slots + [
            Slot("forward", "token counts per expert", "all_to_all", "ep"),
            Slot("forward", "dispatch tokens to their experts", "all_to_all", "ep"),
            Slot("forward", f"experts {layer}"),
            Slot("forward", "combine expert outputs", "all_to_all", "ep"),
        ]
    if styles.sp:
        slots.append(Slot("forward", "feed-forward input (whole sequence)", "all_gather", "tp"))
    slots.append(Slot("forward", f"feed-forward {layer}"))
    if styles.tp:
        slots.append(Slot("forward", "w2's partial output", styles.tp_op, "tp"))
    return slots


def _head_forward(styles: _Styles) -> list[Slot]:
    slots = [Slot("forward", "head input (whole sequence)", "all_gather", "tp")] if styles.sp else []
    slots.append(Slot("forward", "head + loss"))
    if styles.tp:
        slots.append(Slot("forward", "logits (vocabulary shards)", "all_gather", "tp"))
    return slots


def _layer_backward(styles: _Styles, layer: int) -> list[Slot]:
    """A layer's backward up to its gradients: the gather again, its feed-forward or MoE, then attention."""
    name, tp, sp = styles.unit(layer), styles.tp, styles.sp
    slots = []
    if styles.shard:
        slots.append(Slot("backward", f"{name} parameters again (resharded after forward)", "all_gather", "fsdp"))
    if styles.model == "mlp":
        return slots + [Slot("backward", name)]
    if layer in styles.moe_layers:
        slots.append(Slot("backward", "combine gradient", "all_to_all", "ep"))
        if styles.expert_shard:
            slots.append(Slot("backward", "expert parameters again", "all_gather", "efsdp"))
        slots += [Slot("backward", f"experts {layer}"), Slot("backward", "dispatch gradient", "all_to_all", "ep")]
        if styles.expert_shard:
            slots.append(Slot("backward", "expert gradients", "reduce_scatter", "efsdp"))
    else:
        if sp:
            slots.append(Slot("backward", "w2 output gradient", "all_gather", "tp"))
        slots.append(Slot("backward", f"feed-forward {layer}"))
        if tp:
            slots.append(Slot("backward", "feed-forward input gradient", styles.tp_op, "tp"))
    if sp:
        slots.append(Slot("backward", "wo output gradient", "all_gather", "tp"))
    slots.append(Slot("backward", f"attention {layer}"))
    if styles.cp:
        slots.append(Slot("backward", "K/V gradients back to their chunks", "reduce_scatter", "cp"))
    if tp:  # wq, wk, wv's partial input gradients summed first: one collective per block input
        slots.append(Slot("backward", "attention input gradient", styles.tp_op, "tp"))
    return slots


def _unit_gradients(styles: _Styles, unit: str) -> list[Slot]:
    """A unit's gradient collectives: reduce-scatter (FSDP), all-reduce over replicas, SP's partial norms."""
    replica_group = MeshDim.DP_REPLICATE if styles.shard else UNSHARDED_DP_GROUP
    slots = [Slot("backward", f"gradients of {unit}", "reduce_scatter", "fsdp")] if styles.shard else []
    if styles.replicate:
        slots.append(
            Slot("backward", f"gradient {'shard ' if styles.shard else ''}of {unit}", "all_reduce", replica_group)
        )
    if styles.sp:
        slots.append(Slot("backward", f"partial norm gradients of {unit}", "all_reduce", "tp"))
    return slots


def schedule_counts(schedule: list[Slot]) -> Counter:
    """(op, group, phase) -> number of collectives: the cost model's ``CostEstimate.counts()`` keys."""
    return Counter((s.op, s.group, s.phase) for s in schedule if s.op is not None)
