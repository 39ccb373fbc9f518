"""Per-rank memory of one training step: sharded state exactly, activations as a documented estimate.

Sharded state (what every rank keeps for the whole run; ``units.Unit.shard_numel`` elements per unit,
padding included, exactly what fully_shard allocates):
    parameters   shard_numel * storage bytes
    gradients    shard_numel * storage bytes   (reduced gradients are cast back to the storage dtype)
    optimizer    shard_numel * optimizer_state bytes

Transient, at the peak of backward (no prefetch):
    gathered     the root's all-gathered parameters (kept from forward to backward) + the largest
                 other unit's all-gathered parameters (compute bytes) and its unsharded gradients
                 (reduce bytes); nothing when shard_size is 1 and compute == storage (they alias).
                 With reshard_after_forward False every unit keeps its gathered parameters from its
                 forward to its backward: all of them are resident when backward starts

Activations saved for backward (a fused attention kernel that keeps only q, k, v, the output and a
logsumexp per row), in elements per token of this rank for one micro-batch (N = B * s tokens, B =
micro_batch rows, s = seq_len / cp; SP divides the residual-stream tensors by tp), times the compute
bytes, without activation checkpointing:
    dense layer  norms' inputs 2 d / sp + the two gathered inputs of the colwise layers 2 d
                 + q and the attention output 2 d / tp + k, v 2 kv (kv = K/V heads per tp rank x head_dim)
                 + the K/V gathered from the other CP ranks 2 kv (cp - 1)
                 + feed-forward hidden 2 F / tp (w1 output, activation), 4 F / tp gated (w1, w3, silu, product)
    MoE layer    the attention part, ffn_norm input d / sp, and per token the MoE sees (1/tp of them
                 under SP with etp == 1) its router input d, per routed slot (top_k) the row d, hidden
                 2 F_e / etp (4 gated) and output d, and the shared expert d + 2 F_s (4 gated)
    head         logits in float32 for the loss: V * 4 bytes per token once TP has all-gathered them,
                 V / tp * 4 with ``loss_parallel`` (the logits stay sharded over the vocabulary)
    MLP          per block 2 d + 2 F (norm and w1 inputs, hidden, ReLU output), plus d_in + d_out
Activation checkpointing (``ModelConfig.activation_checkpointing``):
    op           (torchtitan's per-op checkpointing) estimated as selective: what it saves and
                 recomputes differs per op, the elementwise results are recomputed as here
    selective    the attention output (d / tp) and the feed-forward's elementwise results (silu and
                 product: 2 F / tp gated, the activation F / tp plain; the same in experts) are recomputed
    full         every layer keeps only its input (d / sp); one layer's activations (the largest, as
                 without checkpointing) are live again while it is recomputed and backpropagated
It is an estimate for comparing layouts, not a measured peak (allocator slack, temporaries and
communication buffers are not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass

from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.cost_model.units import Unit
from hyper_parallel.mesh import ParallelDims


@dataclass(frozen=True)
class Memory:
    """Bytes per rank."""

    parameters: int
    gradients: int
    optimizer: int
    gathered: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.gathered + self.activations

    def as_dict(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "gathered": self.gathered,
            "activations": self.activations,
            "total": self.total,
        }


def _gathered_bytes(units: list[Unit], config: ModelConfig) -> int:
    """Peak all-gathered parameters and unsharded gradients (module docstring, "gathered")."""
    precision = config.precision

    def unsharded(unit: Unit) -> int:
        if unit.shard_size == 1 and precision.compute == precision.storage:
            return 0
        return unit.gathered_numel * precision.compute

    kept = sum(unsharded(u) for u in units if not u.reshard_after_forward)  # the root, or every unit
    others = [
        (0 if not u.reshard_after_forward else unsharded(u)) + u.gathered_numel * precision.reduce
        for u in units
        if not u.is_root
    ]
    return kept + max(others, default=0)


def _layer_activation_elements(config: ModelConfig, dims: ParallelDims, layer: int) -> float:
    """Elements saved per token of this rank by one layer (module docstring)."""
    d, tp, cp, etp = config.d_model, dims.tp, dims.cp, dims.etp
    sp = tp if config.uses_sequence_parallel(dims) else 1
    kv_dim = config.kv_heads_per_rank(tp) * config.head_dim
    selective = config.activation_checkpointing in ("selective", "op")
    attention = d / sp + d + (d if selective else 2 * d) / tp + 2 * kv_dim + 2 * kv_dim * (cp - 1)
    hidden_factor = (2 if config.gated_ffn else 1) if selective else (4 if config.gated_ffn else 2)
    if layer not in config.moe_layers:
        return attention + d / sp + d + hidden_factor * config.ffn_hidden / tp
    routed = config.top_k * (2 * d + hidden_factor * config.moe_hidden / etp)
    shared = (d + hidden_factor * config.shared_expert_hidden) if config.shared_expert_hidden else 0
    moe_tokens = 1 / tp if etp == 1 and sp > 1 else 1  # etp == 1 under SP: the MoE sees the sequence shard
    return attention + d / sp + (d + routed + shared) * moe_tokens


def activation_bytes(
    config: ModelConfig, dims: ParallelDims, layers: tuple[int, ...] | None = None, head: bool = True
) -> int:
    """Saved activations of one micro-batch on this rank (module docstring), over ``layers`` (default all)
    and with the float32 logits when this rank runs the ``head`` (a pipeline's last stage)."""
    layers = tuple(range(config.n_layers)) if layers is None else layers
    tokens = config.accumulation(dims)[0] * (config.seq_len // dims.cp)
    a = config.precision.compute
    if config.architecture == "mlp":  # per block: norm input, w1 input, hidden, relu output
        per_token = config.n_layers * (2 * config.d_model + 2 * config.ffn_hidden) + config.d_in + config.d_out
        return int(tokens * per_token * a)
    per_layer = [_layer_activation_elements(config, dims, layer) for layer in layers]
    if config.activation_checkpointing == "full":
        sp = dims.tp if config.uses_sequence_parallel(dims) else 1
        saved = len(layers) * config.d_model / sp + max(per_layer, default=0.0)
    else:
        saved = sum(per_layer)
    vocab = config.vocab_size / (dims.tp if config.loss_parallel else 1)
    return int(tokens * (saved * a + (vocab * 4 if head else 0)))


def memory(config: ModelConfig, dims: ParallelDims, units: list[Unit]) -> Memory:
    shard = sum(u.shard_numel for u in units)
    precision = config.precision
    return Memory(
        parameters=shard * precision.storage,
        gradients=shard * precision.storage,
        optimizer=shard * precision.optimizer_state,
        gathered=_gathered_bytes(units, config),
        activations=activation_bytes(config, dims),
    )


def pipelined_gathered_bytes(units: list[Unit], config: ModelConfig) -> int:
    """A pipeline stage's peak gathered bytes under torch.distributed.pipelining's FSDP handling: the
    gradients are reduced once, after the last microbatch's backward (``set_requires_gradient_sync``),
    and parameters reshard only then (``set_reshard_after_backward``). So at the peak every unit's
    parameters are gathered (compute bytes) and its unsharded gradients accumulate (reduce bytes, as
    FSDP2's ``unsharded_accumulated_grad``); nothing extra when nothing is sharded and they alias."""
    precision = config.precision
    total = 0
    for unit in units:
        if unit.shard_size > 1 or precision.compute != precision.storage:
            total += unit.gathered_numel * precision.compute
        if unit.shard_size > 1:
            total += unit.gathered_numel * precision.reduce
    return total
