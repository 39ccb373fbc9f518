"""FLOPs of one training step: the whole model's, and one rank's share, counted per matmul.

A matmul of an [n, k] input with a [k, m] weight costs 2 n k m FLOPs (one multiply and one add per
term). Per token, forward, with s = seq_len, d = d_model, kv = kv_heads * head_dim, V = vocab:

    attention projections   2 (d d [wq] + 2 d kv [wk, wv] + d d [wo]) (wq and wo n_heads x head_dim wide
                            where head_dim is set apart from d; MLA: its down- and up-projections)
    attention core          4 s d: q k^T and softmax(.) v, each 2 s d per query token, over all s keys
                            (the PaLM / Megatron convention: causal masking is not halved, so MFU figures
                            are comparable with published ones); s is the window where a sliding window
                            applies (Mistral), and MLA's heads are head_dim (q k) and v_head_dim (v) wide
    prediction module       a multi-token-prediction block (DeepSeek-V3) as a layer, its projection
                            2 (2 d d), and the head again
    dense feed-forward      2 (3 d F) gated (w1, w3, w2), 2 (2 d F) plain
    MoE feed-forward        router 2 d E; per routed slot (top_k) 2 (3 d F_e) gated; shared expert 2 (3 d F_s)
    head                    2 d V (the embedding is a lookup: no FLOPs)
    MLP                     per block 2 (2 d F); input 2 d_in d; head 2 d d_out
Norms, activations, softmax and the loss are elementwise and not counted (<1 % at these sizes).

Backward costs twice the forward (the gradient of the input and of the weight, one matmul each).
Activation checkpointing adds recomputed forward FLOPs to the backward (``ModelConfig``):
    op          torchtitan's per-op selective checkpointing: every other matmul of a layer again (half the
                layers' matmul FLOPs; it saves the attention kernel's output and recomputes elementwise ops)
    selective   the attention core of every layer again (4 s d per token per layer; the elementwise
                ops it also recomputes cost no matmul FLOPs)
    full        every layer's forward again (not the head, which runs outside the checkpointed layers)

So a dense transformer trains at 3 x forward = 6 N_matmul + 12 L s d FLOPs per token, where N_matmul
counts the parameters that multiply (all but the embedding table): the 6 N rule plus the attention
term (Kaplan et al. 2020; Narayanan et al. 2021, eq. 3, whose 72 B s L h^2 (1 + s / 6h + V / 12 L h)
is this count for a GPT block, and 96 B s L h^2 (1 + s / 6h + V / 16 L h) with full recomputation).

Per rank: TP splits every matmul evenly, CP the query tokens, DP the rows, EP the routed slots
(balanced routing), so a rank does global / world_size, plus what it repeats: with tp > kv_heads each
K/V head is computed on tp / kv_heads ranks. ``model_flops`` (no recomputation) is what MFU divides.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.mesh import ParallelDims


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one rank in one step (all micro-batches)."""

    forward: float
    backward: float  # 2 x forward
    recompute: float  # activation checkpointing's extra forward work
    model: float  # forward + backward without recomputation: what MFU counts

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def attention_projection_weights(config: ModelConfig) -> float:
    """Weight elements of one layer's attention projections (every one multiplies each token once):
    wq, wk, wv, wo; MLA's down- and up-projections instead (``units._latent_attention``)."""
    d = config.d_model
    if config.kv_lora_rank:
        heads = config.n_heads
        q = config.q_lora_rank * (d + heads * config.head_dim) if config.q_lora_rank else d * heads * config.head_dim
        kv = d * (config.kv_lora_rank + config.qk_rope_head_dim)
        kv += config.kv_lora_rank * heads * (config.qk_nope_head_dim + config.v_head_dim)
        return q + kv + config.attention_out_dim * d
    return d * config.q_dim + 2 * d * config.kv_heads * config.head_dim + config.attention_out_dim * d


def layer_forward_flops_per_token(config: ModelConfig, layer: int) -> float:
    """Forward matmul FLOPs per token of one transformer layer, attention core excluded (module docstring)."""
    d = config.d_model
    matrices = 3 if config.gated_ffn else 2
    projections = 2 * attention_projection_weights(config)
    if config.is_moe_layer(layer):
        ffn = 2 * d * config.num_experts + config.top_k * 2 * matrices * d * config.moe_hidden
        ffn += 2 * matrices * d * config.shared_expert_hidden
    else:
        ffn = 2 * matrices * d * config.ffn_hidden
    mtp = 2 * 2 * d * d if layer >= config.n_layers else 0.0  # a prediction module's eh_proj [d, 2d]
    return projections + ffn + mtp


def attention_core_flops_per_token(config: ModelConfig, layer: int) -> float:
    """q k^T and the weighted sum of values, 2 x keys x (qk + v dims of all heads), not halved for the
    causal mask (module docstring); the keys are the window where a sliding window applies."""
    return 2 * config.attended_keys(layer) * config.n_heads * (config.head_dim + config.value_head_dim)


def layer_kinds(config: ModelConfig, layers) -> dict[tuple, list[int]]:
    """Layers that cost alike (dense or MoE, windowed or not, prediction module or not) -> [one of them,
    how many]: the cost model works out one layer per kind (a --compare costs thousands of layouts)."""
    if not (config.moe_layers or config.sliding_window or config.mtp_layers):
        return {(False, config.seq_len, False): [layers[0], len(layers)]} if layers else {}
    kinds: dict[tuple, list[int]] = {}
    for layer in layers:
        key = (config.is_moe_layer(layer), config.attended_keys(layer), layer >= config.n_layers)
        kinds.setdefault(key, [layer, 0])[1] += 1
    return kinds


def forward_flops_per_token(
    config: ModelConfig, layers: tuple[int, ...] | None = None, head: bool = True
) -> dict[str, float]:
    """Forward FLOPs per token of the whole model (or of ``layers`` and, with ``head``, the LM head: one
    pipeline stage), by part (module docstring); a multi-token-prediction module runs the head again."""
    d = config.d_model
    if config.architecture == "mlp":
        return {
            "layers": config.n_layers * 2 * 2 * d * config.ffn_hidden,
            "attention_core": 0.0,
            "head": 2 * config.d_in * d + 2 * d * config.d_out,
        }
    layers = tuple(range(config.total_layers)) if layers is None else layers
    kinds = layer_kinds(config, layers)
    return {
        "layers": sum(count * layer_forward_flops_per_token(config, layer) for layer, count in kinds.values()),
        "attention_core": sum(count * attention_core_flops_per_token(config, layer) for layer, count in kinds.values()),
        "head": (1 + config.mtp_layers) * 2 * d * config.vocab_size if head else 0.0,
    }


def _kv_replication_per_token(config: ModelConfig, dims: ParallelDims, n_layers: int) -> float:
    """Extra forward FLOPs per token of the mesh when tp > kv_heads: each K/V head computed on
    tp / kv_heads ranks instead of one (2 matrices x 2 d head_dim per head)."""
    if config.architecture == "mlp" or dims.tp <= config.kv_heads:
        return 0.0
    repeated_heads = config.kv_heads_per_rank(dims.tp) * dims.tp - config.kv_heads
    return n_layers * 2 * 2 * config.d_model * config.head_dim * repeated_heads


def step_flops(
    config: ModelConfig, dims: ParallelDims, layers: tuple[int, ...] | None = None, head: bool = True
) -> StepFlops:
    """One rank's FLOPs in one step of ``config.global_batch`` sequences on ``dims``; with pp > 1 those of
    the pipeline stage holding ``layers`` (and the head when ``head``): its share is pp / world_size."""
    parts = forward_flops_per_token(config, layers, head)
    n_layers = config.total_layers if layers is None else len(layers)
    tokens = config.global_batch * config.seq_len * (dims.pp if layers is not None else 1)
    forward_model = sum(parts.values()) * tokens / dims.world_size
    forward = forward_model + _kv_replication_per_token(config, dims, n_layers) * tokens / dims.world_size
    recomputed = {
        "none": 0.0,
        "op": parts["layers"] / 2,
        "selective": parts["attention_core"],
        "full": parts["layers"] + parts["attention_core"],
    }[config.activation_checkpointing]
    return StepFlops(
        forward=forward, backward=2 * forward, recompute=recomputed * tokens / dims.world_size, model=3 * forward_model
    )
