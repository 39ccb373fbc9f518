"""FLOPs of one training step: the whole model's, and one rank's share, counted per matmul.

A matmul of an [n, k] input with a [k, m] weight costs 2 n k m FLOPs (one multiply and one add per
term). Per token, forward, with s = seq_len, d = d_model, kv = kv_heads * head_dim, V = vocab:

    attention projections   2 (d d [wq] + 2 d kv [wk, wv] + d d [wo])
    attention core          4 s d: q k^T and softmax(.) v, each 2 s d per query token, over all s keys
                            (the PaLM / Megatron convention: causal masking is not halved, so MFU figures
                            are comparable with published ones)
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


def layer_forward_flops_per_token(config: ModelConfig, layer: int) -> float:
    """Forward matmul FLOPs per token of one transformer layer, attention core excluded (module docstring)."""
    d = config.d_model
    matrices = 3 if config.gated_ffn else 2
    kv = config.kv_heads * config.head_dim
    projections = 2 * (2 * d * d + 2 * d * kv)
    if layer in config.moe_layers:
        ffn = 2 * d * config.num_experts + config.top_k * 2 * matrices * d * config.moe_hidden
        ffn += 2 * matrices * d * config.shared_expert_hidden
    else:
        ffn = 2 * matrices * d * config.ffn_hidden
    return projections + ffn


def forward_flops_per_token(
    config: ModelConfig, layers: tuple[int, ...] | None = None, head: bool = True
) -> dict[str, float]:
    """Forward FLOPs per token of the whole model (or of ``layers`` and, with ``head``, the LM head: one
    pipeline stage), by part (module docstring)."""
    d = config.d_model
    if config.architecture == "mlp":
        return {
            "layers": config.n_layers * 2 * 2 * d * config.ffn_hidden,
            "attention_core": 0.0,
            "head": 2 * config.d_in * d + 2 * d * config.d_out,
        }
    layers = tuple(range(config.n_layers)) if layers is None else layers
    return {
        "layers": sum(layer_forward_flops_per_token(config, layer) for layer in layers),
        "attention_core": len(layers) * 4 * config.seq_len * d,
        "head": 2 * d * config.vocab_size if head else 0.0,
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
    n_layers = config.n_layers if layers is None else len(layers)
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
