"""What the recipes' eager mini transformer saves for backward, item by item, beside the cost model's estimate.

The cost model's activations (``memory.activation_bytes``) describe a production stack at its peak: fused
kernels (a norm keeps only its input, the attention output is kept once), the layers and the logits only,
and the loss's backward holding ``Stack.loss_copies`` float32 logits at once. A workbook run measures
something narrower on eager code: the tensors autograd keeps at the end of forward
(``recipes.activation_memory``). On the mini transformer (``models/transformer.py``) the two differ by
named items, each a tensor the eager code keeps:

    loss copies    the loss's backward holds ``loss_copies`` float32 logits at its peak; forward saved one
                   (the log-softmax): the others are not saved tensors
    eager norms    each RMSNorm is ``x * rsqrt(mean(x^2) + eps) * w`` op by op: beside its input it keeps the
                   normalized ``x`` (for ``w``'s gradient) and one rstd per token (a fused norm recomputes both)
    wo's input     the attention output transposed to [batch, seq, heads x head_dim] is a new tensor, kept for
                   ``wo`` beside the kernel's own output
    final norm     the model counts the layers and the logits; the final norm (its three tensors) and the
                   head's input are one layer's worth less than that at scale, a fifth of the total here
    small          the attention's logsumexp (one float32 per head and query), the token ids and the targets
                   (int64), the loss's weight sum (one float32), the rotary cos / sin tables (one per call,
                   [seq, head_dim / 2])

The model's estimate less the first item plus the others is the measured bytes exactly
(tests/test_cost_model_eager.py on one process, tests/test_tp_sp_traces.py on M2 and M3's ranks).
"""

from __future__ import annotations

from hyper_parallel.cost_model.memory import activation_bytes
from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.cost_model.stacks import get_stack
from hyper_parallel.mesh import ParallelDims

INDEX_BYTES = 8  # token ids and targets are int64
STATISTIC_BYTES = 4  # the attention's logsumexp and the loss's weight sum are float32


def _check_mini_transformer(config: ModelConfig, dims: ParallelDims) -> None:
    """The items describe the dense mini transformer without CP, checkpointing or float8; anything else saves
    other tensors."""
    unsupported = {
        "architecture 'transformer'": config.architecture == "transformer",
        "no MoE layers": not config.moe_layers,
        "cp = 1 and no ulysses dim": dims.cp == 1 and getattr(dims, "ulysses", 1) == 1,
        "no activation checkpointing": config.activation_checkpointing == "none",
        "no float8": not config.float8,
        "a plain feed-forward (not gated)": not config.gated_ffn,
        "standard attention (no MLA, no qk norm)": not config.kv_lora_rank and not config.qk_norm,
        "no multi-token prediction or embedding norm": not config.mtp_layers and not config.embedding_norm,
    }
    missing = [rule for rule, holds in unsupported.items() if not holds]
    if missing:
        raise ValueError(
            f"eager_saved describes the recipes' dense mini transformer; {config.name} on {dims} breaks: "
            f"{', '.join(missing)}. Use cost_model.memory.activation_bytes for other models"
        )


def eager_saved_items(config: ModelConfig, dims: ParallelDims) -> dict[str, int]:
    """Every tensor the eager mini transformer saves for backward on one rank, in bytes, grouped: what
    ``SavedActivations`` measures, derived from the shapes alone."""
    _check_mini_transformer(config, dims)
    d, tp, layers = config.d_model, dims.tp, config.n_layers
    sp = tp if config.uses_sequence_parallel(dims) else 1
    rows, seq = config.accumulation(dims)[0], config.seq_len
    tokens, a = rows * seq, config.precision.compute
    gathered = d if get_stack(config.stack).sp_input == "gathered" else d / sp
    norm_input, norm_extra = d / sp, (d + 1) / sp  # the input; the normalized x and the rstd
    vocab = config.vocab_size / (tp if config.loss_parallel else 1)
    per_layer = {
        "norm inputs": 2 * norm_input,
        "norms' normalized x and rstd": 2 * norm_extra,
        "colwise inputs": 2 * gathered,
        "q, k, v and the attention output": 4 * config.q_dim / tp,
        "wo's input": config.q_dim / tp,
        "feed-forward hidden (w1 output, silu output)": 2 * config.ffn_hidden / tp,
    }
    items = {name: int(layers * tokens * elements * a) for name, elements in per_layer.items()}
    items["final norm and the head's input"] = int(tokens * (norm_input + norm_extra + gathered) * a)
    items["logits (the saved log-softmax)"] = int(tokens * vocab * 4)
    items["logsumexp"] = layers * tokens * config.n_heads // tp * STATISTIC_BYTES
    items["token ids, targets, the loss's weight sum"] = 2 * tokens * INDEX_BYTES + STATISTIC_BYTES
    items["rotary cos / sin tables"] = layers * 2 * 2 * seq * config.head_dim // 2 * a
    return items


def activation_reconciliation(config: ModelConfig, dims: ParallelDims) -> list[tuple[str, int]]:
    """From the cost model's activations to what the eager run saves (module docstring): rows of (what,
    signed bytes) whose sum is ``sum(eager_saved_items(...).values())``."""
    items = eager_saved_items(config, dims)
    stack = get_stack(config.stack)
    copies = stack.loss_parallel_copies if config.loss_parallel and dims.tp > 1 else stack.loss_copies
    logits = items["logits (the saved log-softmax)"]
    small = items["logsumexp"] + items["token ids, targets, the loss's weight sum"] + items["rotary cos / sin tables"]
    return [
        ("the cost model's activations (the trade-off table)", activation_bytes(config, dims)),
        (
            f"the loss's backward copies of the logits ({copies - 1} of {copies}, not saved in forward)",
            -(copies - 1) * logits,
        ),
        ("eager RMSNorm: each norm's normalized x and rstd (fused: recomputed)", items["norms' normalized x and rstd"]),
        ("wo's input: the attention output laid out again (fused: the kernel's own)", items["wo's input"]),
        (
            "the final norm and the head's input (the model counts layers and logits)",
            items["final norm and the head's input"],
        ),
        ("logsumexp, token ids, targets, rotary tables", small),
    ]
