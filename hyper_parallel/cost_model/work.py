"""A rank's compute time from its work: GEMMs by shape, attention, memory-bound kernels, the optimizer.

Not an assumed fraction of peak: each kind of work runs at the speed its shape allows on the machine
(``hardware.Hardware``), so a layout that cuts matmuls thin (wide TP), runs small micro-batches or
spends its time in norms and elementwise ops is slower per FLOP, and MFU comes out of the model.

Per micro-batch of T = micro_batch x seq_len / cp tokens on this rank (SP gathers the sequence back
before every colwise GEMM, so GEMMs see T rows either way), one layer's forward GEMMs (m, n, k):
    wq (T, d/tp, d), wk and wv (T, kv/tp, d), wo (T, d, d/tp),
    w1 (and w3) (T, F/tp, d), w2 (T, d, F/tp)          dense feed-forward
    per local expert (T top_k ep / E, F_e/etp, d) ...   E/ep experts of a MoE layer (balanced routing),
    shared expert as a dense one of F_s (not split by tp), router (T, E, d)
    head (T, V/tp, d)                                  on the stage that holds it
A GEMM of 2 m n k FLOPs takes 2 m n k / (peak x gemm_efficiency x f(m) f(n) f(k)), f(x) = x / (x + tile);
backward is two GEMMs of the same sizes (input and weight gradients): twice the forward time.
Attention core (FlashAttention): the counted 4 s d per token per layer (``compute``), halved by the
causal mask, at the efficiency of a GEMM with inner dimension head_dim: f(T) f(s) f(head_dim);
backward 2.5 x forward (it recomputes q k^T: five matmuls against two).
Memory-bound bytes (compute-dtype elements, read + written) per token per layer, forward: norms
2 x 2 d/sp, residual adds 2 x 3 d/sp, rotary 2 (d + kv)/tp, the activation 3 F/tp gated (2 F/tp plain),
MoE permutation 4 top_k d; backward twice as much; the loss 5 x 4 B per logit on the head's stage.
They run at hbm_bandwidth x memory_efficiency. Activation checkpointing repeats the forward of what
it recomputes (``compute.step_flops``: the attention core for "selective", whole layers for "full",
half the layers' GEMMs and the elementwise ops for "op").
Optimizer step once per step: Adam reads parameter, gradient, two moments in float32 and writes three
(28 B per shard element) and casts the parameter to the compute dtype (6 B); SGD 12 B.
Not modelled: kernel launch gaps, the data loader, stragglers (the calibration absorbs their average).
"""

from __future__ import annotations

from dataclasses import dataclass

from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.cost_model.units import Unit
from hyper_parallel.mesh import ParallelDims


@dataclass(frozen=True)
class WorkTime:
    """Seconds of one rank's compute in one step, by kind of work."""

    gemm: float
    attention: float
    memory_bound: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.memory_bound + self.optimizer


def _shape_factor(hardware, *sizes: float) -> float:
    result = 1.0
    for x in sizes:
        result *= x / (x + hardware.tile)
    return result


def gemm_seconds(m: float, n: float, k: float, hardware) -> float:
    """One GEMM of an (m, k) by (k, n) product: 2 m n k FLOPs at its shape's efficiency."""
    if min(m, n, k) <= 0:
        return 0.0
    rate = hardware.peak_flops * hardware.gemm_efficiency * _shape_factor(hardware, m, n, k)
    return 2 * m * n * k / rate


def _layer_gemms(
    config: ModelConfig, dims: ParallelDims, layer: int, tokens: float
) -> list[tuple[float, float, float]]:
    d, tp = config.d_model, dims.tp
    kv = config.kv_heads_per_rank(tp) * config.head_dim
    shapes = [(tokens, d / tp, d), (tokens, kv, d), (tokens, kv, d), (tokens, d, d / tp)]
    matrices = 3 if config.gated_ffn else 2
    if layer not in config.moe_layers:
        f = config.ffn_hidden / tp
        return shapes + [(tokens, f, d)] * (matrices - 1) + [(tokens, d, f)]
    moe_tokens = tokens / (tp if dims.etp == 1 and config.uses_sequence_parallel(dims) else 1)
    local_experts = config.num_experts // dims.ep
    rows = moe_tokens * config.top_k * dims.ep / config.num_experts
    fe = config.moe_hidden / dims.etp
    shapes += [(moe_tokens, config.num_experts, d)]
    shapes += ([(rows, fe, d)] * (matrices - 1) + [(rows, d, fe)]) * local_experts
    if config.shared_expert_hidden:
        fs = config.shared_expert_hidden
        shapes += [(moe_tokens, fs, d)] * (matrices - 1) + [(moe_tokens, d, fs)]
    return shapes


def _layer_memory_elements(config: ModelConfig, dims: ParallelDims, layer: int) -> float:
    d, tp = config.d_model, dims.tp
    sp = tp if config.uses_sequence_parallel(dims) else 1
    kv = config.kv_heads_per_rank(tp) * config.head_dim
    hidden = config.ffn_hidden / tp if layer not in config.moe_layers else config.top_k * config.moe_hidden / dims.etp
    hidden += config.shared_expert_hidden if layer in config.moe_layers else 0
    elements = 4 * d / sp + 6 * d / sp + 2 * (d / tp + kv) + (3 if config.gated_ffn else 2) * hidden
    return elements + (4 * config.top_k * d if layer in config.moe_layers else 0)


def work_time(
    config: ModelConfig,
    dims: ParallelDims,
    hardware,
    units: list[Unit],
    layers: tuple[int, ...] | None = None,
    head: bool = True,
) -> WorkTime:
    """One rank's compute time in one step (module docstring); with pp > 1 of the stage holding ``layers``."""
    layers = tuple(range(config.n_layers)) if layers is None else layers
    rows, microbatches = config.accumulation(dims)
    tokens = rows * config.seq_len / dims.cp
    ac = config.activation_checkpointing
    gemm_passes = 3 + {"full": 1.0, "op": 0.5}.get(ac, 0.0)
    memory_passes = 3 + (1 if ac in ("full", "op") else 0)
    recompute_attention = ac in ("selective", "full")
    gemm = attention = elements = 0.0
    for layer in layers:
        forward = sum(gemm_seconds(m, n, k, hardware) for m, n, k in _layer_gemms(config, dims, layer, tokens))
        gemm += forward * gemm_passes
        heads = config.n_heads / dims.tp
        attention_flops = 4 * config.seq_len * config.head_dim * heads * tokens * 0.5
        rate = hardware.peak_flops * hardware.gemm_efficiency
        rate *= _shape_factor(hardware, tokens, config.seq_len, config.head_dim)
        attention += attention_flops / rate * (1 + 2.5 + (1 if recompute_attention else 0))
        elements += _layer_memory_elements(config, dims, layer) * tokens * memory_passes
    memory_bytes = elements * config.precision.compute
    if head:
        gemm += 3 * gemm_seconds(tokens, config.vocab_size / dims.tp, config.d_model, hardware)
        memory_bytes += 5 * 4 * tokens * config.vocab_size / dims.tp
    memory_rate = hardware.hbm_bytes_per_second * hardware.memory_efficiency
    shard = sum(u.shard_numel for u in units)
    per_element = 28 + 6 if config.precision.optimizer_state else 12
    return WorkTime(
        gemm * microbatches,
        attention * microbatches,
        memory_bytes * microbatches / memory_rate,
        shard * per_element / memory_rate,
    )
