"""A rank's compute time from its work: GEMMs by shape, attention, memory-bound kernels, the optimizer.

Not an assumed fraction of peak: each kind of work runs at the speed its shape allows on the machine
(``hardware.Hardware``), so a layout that cuts matmuls thin (wide TP), runs small micro-batches or
spends its time in norms and elementwise ops is slower per FLOP, and MFU comes out of the model.

Per micro-batch of T = micro_batch x seq_len / cp tokens on this rank (SP gathers the sequence back
before every colwise GEMM, so GEMMs see T rows either way), one layer's forward GEMMs (m, n, k):
    wq (T, n_heads hd/tp, d), wk and wv (T, kv/tp, d), wo (T, d, n_heads hd/tp)
    MLA instead: wq_a (T, q_lora, d), wq_b (T, n_heads hd/tp, q_lora) (or wq), wkv_a (T, kv_lora + rope, d),
                 wkv_b (T, n_heads (nope + v)/tp, kv_lora), wo (T, d, n_heads v/tp)
    w1 (and w3) (T, F/tp, d), w2 (T, d, F/tp)          dense feed-forward
    per local expert (T top_k ep / E, F_e/etp, d) ...   E/ep experts of a MoE layer (balanced routing),
    shared expert as a dense one of F_s (not split by tp), router (T, E, d)
    eh_proj (T, d, 2d)                                 a multi-token-prediction module's projection
    head (T, V/tp, d)                                  on the stage that holds it (and once per module)
A GEMM of 2 m n k FLOPs takes 2 m n k / (peak x gemm_efficiency x f(m) f(n) f(k)), f(x) = x / (x + tile);
backward is two GEMMs of the same sizes (input and weight gradients): twice the forward time. With
``float8`` (torchao's tensorwise float8 linears, DeepSeek-V3's FP8 GEMMs) the layers' GEMMs run at the
hardware's fp8 peak (the head and attention stay in bf16) and each one casts its input, weight and
output gradient to float8 first: 3 B per element read and written (bf16 in, fp8 out), the input and the
output gradient twice (a transposed copy for the weight gradient).
Attention core (FlashAttention): the counted FLOPs (``compute``) of the keys a query really sees (half the
sequence under the causal mask; w (1 - w / 2s) with a sliding window w < s), at the efficiency of a GEMM
with inner dimension head_dim: f(T) f(s) f(head_dim); backward 2.5 x forward (it recomputes q k^T: five
matmuls against two).
Memory-bound bytes (compute-dtype elements, read + written) per token per layer, forward: norms
2 x 2 d/sp, residual adds 2 x 3 d/sp, rotary 2 (d + kv)/tp, the activation 3 F/tp gated (2 F/tp plain),
MoE permutation 4 top_k d; backward twice as much; the loss 5 x 4 B per logit on the head's stage. A
stack that fuses the elementwise ops (torch.compile, Megatron's fused kernels: ``stacks``) moves half
of them. They run at hbm_bandwidth x memory_efficiency. Activation checkpointing repeats the forward of
what it recomputes (``compute.step_flops``: the attention core for "selective", whole layers for "full",
half the layers' GEMMs and the elementwise ops for "op").
Optimizer step once per step: Adam reads parameter, gradient, two moments in float32 and writes three
(28 B per shard element) and casts the parameter to the compute dtype (6 B); SGD 12 B.
Not modelled: kernel launch gaps, the data loader, stragglers (the calibration absorbs their average).
"""

from __future__ import annotations

from dataclasses import dataclass

from hyper_parallel.cost_model.compute import layer_kinds
from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.cost_model.stacks import get_stack
from hyper_parallel.cost_model.units import Unit
from hyper_parallel.mesh import ParallelDims

FUSED_ELEMENTWISE = 0.5
"""Share of the memory-bound traffic left when a stack fuses the elementwise ops of a layer."""
FLOAT8_CAST_BYTES = 3
"""A cast to float8 reads 2 B (bf16) and writes 1 B per element."""


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


def gemm_seconds(m: float, n: float, k: float, hardware, float8: bool = False) -> float:
    """One GEMM of an (m, k) by (k, n) product: 2 m n k FLOPs at its shape's efficiency (at the fp8 peak
    for a float8 GEMM)."""
    if min(m, n, k) <= 0:
        return 0.0
    peak = hardware.fp8_peak_flops if float8 else hardware.peak_flops
    rate = peak * hardware.gemm_efficiency * _shape_factor(hardware, m, n, k)
    return 2 * m * n * k / rate


def _attention_gemms(config: ModelConfig, dims: ParallelDims, tokens: float) -> list[tuple[float, float, float]]:
    d, tp = config.d_model, dims.tp
    if config.kv_lora_rank:
        heads = config.n_heads / tp
        if config.q_lora_rank:
            q = [(tokens, config.q_lora_rank, d), (tokens, heads * config.head_dim, config.q_lora_rank)]
        else:
            q = [(tokens, heads * config.head_dim, d)]
        kv_b = heads * (config.qk_nope_head_dim + config.v_head_dim)
        return q + [
            (tokens, config.kv_lora_rank + config.qk_rope_head_dim, d),
            (tokens, kv_b, config.kv_lora_rank),
            (tokens, d, heads * config.v_head_dim),
        ]
    kv = config.kv_heads_per_rank(tp) * config.head_dim
    return [
        (tokens, config.q_dim / tp, d),
        (tokens, kv, d),
        (tokens, kv, d),
        (tokens, d, config.attention_out_dim / tp),
    ]


def _layer_gemms(
    config: ModelConfig, dims: ParallelDims, layer: int, tokens: float
) -> list[tuple[float, float, float]]:
    d, tp = config.d_model, dims.tp
    shapes = _attention_gemms(config, dims, tokens)
    if layer >= config.n_layers:
        shapes.append((tokens, d, 2 * d))  # the prediction module's eh_proj
    matrices = 3 if config.gated_ffn else 2
    if not config.is_moe_layer(layer):
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
    moe = config.is_moe_layer(layer)
    hidden = config.ffn_hidden / tp if not moe else config.top_k * config.moe_hidden / dims.etp
    hidden += config.shared_expert_hidden if moe else 0
    elements = 4 * d / sp + 6 * d / sp + 2 * (config.q_dim / tp + kv) + (3 if config.gated_ffn else 2) * hidden
    elements += 4 * (config.q_dim / tp + kv) if config.qk_norm else 0
    return elements + (4 * config.top_k * d if moe else 0)


def _cast_seconds(shapes: list[tuple[float, float, float]], memory_rate: float) -> float:
    """float8's casts of one forward and backward of these GEMMs (module docstring)."""
    elements = sum(2 * m * k + n * k + 2 * m * n for m, n, k in shapes)
    return elements * FLOAT8_CAST_BYTES / memory_rate


def _attention_seconds(config: ModelConfig, dims: ParallelDims, layer: int, tokens: float, hardware) -> float:
    """One forward of a layer's attention kernel (module docstring)."""
    s, keys = config.seq_len, config.attended_keys(layer)
    seen = s / 2 if keys >= s else keys * (1 - keys / (2 * s))
    flops = 2 * seen * config.n_heads / dims.tp * (config.head_dim + config.value_head_dim) * tokens
    rate = hardware.peak_flops * hardware.gemm_efficiency * _shape_factor(hardware, tokens, s, config.head_dim)
    return flops / rate


def work_time(
    config: ModelConfig,
    dims: ParallelDims,
    hardware,
    units: list[Unit],
    layers: tuple[int, ...] | None = None,
    head: bool = True,
) -> WorkTime:
    """One rank's compute time in one step (module docstring); with pp > 1 of the stage holding ``layers``."""
    layers = tuple(range(config.total_layers)) if layers is None else layers
    rows, microbatches = config.accumulation(dims)
    tokens = rows * config.seq_len / dims.cp
    ac = config.activation_checkpointing
    gemm_passes = 3 + {"full": 1.0, "op": 0.5}.get(ac, 0.0)
    memory_passes = 3 + (1 if ac in ("full", "op") else 0)
    recompute_attention = ac in ("selective", "full")
    memory_rate = hardware.hbm_bytes_per_second * hardware.memory_efficiency
    fused = FUSED_ELEMENTWISE if get_stack(config.stack).elementwise == "fused" else 1.0
    gemm = attention = elements = casts = 0.0
    for layer, count in layer_kinds(config, layers).values():  # one layer of each kind times its count
        shapes = _layer_gemms(config, dims, layer, tokens)
        forward = sum(gemm_seconds(m, n, k, hardware, config.float8) for m, n, k in shapes)
        gemm += count * forward * gemm_passes
        casts += count * _cast_seconds(shapes, memory_rate) if config.float8 else 0.0
        passes = 1 + 2.5 + (1 if recompute_attention else 0)
        attention += count * _attention_seconds(config, dims, layer, tokens, hardware) * passes
        elements += count * _layer_memory_elements(config, dims, layer) * tokens * memory_passes * fused
    memory_bytes = elements * config.precision.compute
    if head:
        heads = 1 + config.mtp_layers
        gemm += heads * 3 * gemm_seconds(tokens, config.vocab_size / dims.tp, config.d_model, hardware)
        memory_bytes += heads * 5 * 4 * tokens * config.vocab_size / dims.tp
    shard = sum(u.shard_numel for u in units)
    per_element = 28 + 6 if config.precision.optimizer_state else 12
    return WorkTime(
        gemm * microbatches,
        attention * microbatches,
        (memory_bytes / memory_rate + casts) * microbatches,
        shard * per_element / memory_rate,
    )
