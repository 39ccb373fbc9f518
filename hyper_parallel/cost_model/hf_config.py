"""A Hugging Face ``config.json`` read into the cost model's model description (``ModelConfig`` fields).

So a reviewer plans their own model (``python -m launch plan --model-config config.json``) instead of
the nearest preset. The families read, and what is taken from each:

    llama, mistral, qwen2,  hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    qwen3 (dense, SwiGLU)   num_key_value_heads (GQA), head_dim, vocab_size, tie_word_embeddings; q/k/v
                            biases (Qwen2 always, Llama when ``attention_bias``); Qwen3's q/k RMSNorm;
                            Mistral's ``sliding_window`` (every layer), Qwen2's when ``use_sliding_window``
                            (the layers from ``max_window_layers`` on)
    mixtral                 every layer a MoE of ``num_local_experts`` SwiGLU experts of
                            ``intermediate_size``, ``num_experts_per_tok`` routed per token; ``sliding_window``
    qwen2_moe, qwen3_moe    MoE layers every ``decoder_sparse_step`` (but ``mlp_only_layers``) of ``num_experts``
                            experts of ``moe_intermediate_size``; Qwen2-MoE's shared expert
                            (``shared_expert_intermediate_size``, with its sigmoid gate) and q/k/v biases,
                            Qwen3-MoE's head_dim and q/k norms
    deepseek, deepseek_v2,  the first ``first_k_dense_replace`` layers dense (``intermediate_size``), then
    deepseek_v3             a MoE every ``moe_layer_freq`` of ``n_routed_experts`` experts of
                            ``moe_intermediate_size`` plus ``n_shared_experts`` shared ones (one shared
                            expert of n_shared x moe_intermediate_size); V2/V3's multi-head latent attention
                            (``q_lora_rank``, ``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``,
                            ``v_head_dim``), V3's multi-token prediction (``num_nextn_predict_layers``) and
                            node-limited routing (``topk_group`` of ``n_group`` groups: one group per node
                            under EP across nodes, DeepSeek-V3 section 3.2.2)
    gpt2                    n_embd, n_layer, n_head, n_inner (default 4 n_embd), GELU MLP, learned
                            positions (n_positions), LayerNorm and Conv1D biases, head tied to the embedding
    opt                     hidden_size, ffn_dim, num_hidden_layers, num_attention_heads, ReLU MLP, learned
                            positions (max_position_embeddings + 2, OPT's offset), biases, tied head;
                            ``word_embed_proj_dim`` other than hidden_size (OPT-350m) is refused
    bloom                   hidden_size (n_embed), n_layer, n_head, 4 h GELU MLP, ALiBi (no position
                            table), the word-embeddings LayerNorm, biases, tied head

Nothing is dropped without a word: a key no family reads and that is not in ``NO_COST`` (keys that do
not change memory, FLOPs or communication: rope scaling, initialisation, token ids, ...) is named in the
model's ``notes`` (printed with every plan); keys that would change the cost but are not modelled are
named with what they would change (``quantization_config``: the checkpoint's storage format, training
precision is --precision / --float8). A layout the model cannot express is refused (``ValueError``).

A config.json holds no training settings: the model gets seq_len = min(context, 4096), a global batch
of 1024 sequences and bf16 mixed precision with Adam (``bf16-adam``) unless the caller gives others
(``ModelConfig.from_hf_config(config, seq_len=..., global_batch=...)``; ``--seq-len``, ``--batch``).
Torch-free and no download: the file is read as JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
DEEPSEEK_TYPES = ("deepseek", "deepseek_v2", "deepseek_v3")
QWEN_MOE_TYPES = ("qwen2_moe", "qwen3_moe")
KNOWN_TYPES = (*DENSE_TYPES, "mixtral", *QWEN_MOE_TYPES, *DEEPSEEK_TYPES, "gpt2", "opt", "bloom")
DEFAULT_SEQ_LEN = 4096
DEFAULT_GLOBAL_BATCH = 1024

NO_COST = frozenset(
    {
        "architectures",
        "model_type",
        "_name_or_path",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "unk_token_id",
        "decoder_start_token_id",
        "prefix",
        "initializer_range",
        "init_std",
        "rms_norm_eps",
        "layer_norm_eps",
        "layer_norm_epsilon",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "use_cache",
        "attention_dropout",
        "hidden_dropout",
        "dropout",
        "activation_dropout",
        "resid_pdrop",
        "embd_pdrop",
        "attn_pdrop",
        "summary_type",
        "summary_use_proj",
        "summary_activation",
        "summary_proj_to_labels",
        "summary_first_dropout",
        "task_specific_params",
        "scale_attn_weights",
        "reorder_and_upcast_attn",
        "scale_attn_by_inverse_layer_idx",
        "n_ctx",
        "hidden_act",
        "activation_function",
        "mlp_bias",
        "pretraining_tp",
        "auto_map",
        "workbook_preset",
        "router_aux_loss_coef",
        "output_router_logits",
        "router_jitter_noise",
        "norm_topk_prob",
        "aux_loss_alpha",
        "seq_aux",
        "scoring_func",
        "routed_scaling_factor",
        "topk_method",
        "ep_size",
        "do_layer_norm_before",
        "enable_bias",
        "layerdrop",
        "apply_residual_connection_post_layernorm",
        "attention_softmax_in_fp32",
        "masked_softmax_fusion",
        "bias_dropout_fusion",
        "skip_bias_add",
        "skip_bias_add_qkv",
        "slow_but_exact",
        "offset_alibi",
        "use_return_dict",
        "tie_word_embeddings",
        "max_position_embeddings",
        "n_positions",
        "is_decoder",
        "_remove_final_layer_norm",
        "qkv_bias",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "keys_to_ignore_at_inference",
        "rope_interleave",
        "partial_rotary_factor",
        "layer_types",
    }
)
"""Keys that change neither memory, FLOPs nor communication as the cost model counts them."""
COST_NOT_MODELLED = {
    "quantization_config": "the checkpoint's storage format (e.g. DeepSeek-V3's fp8 blocks); training precision "
    "is --precision and --float8",
    "attn_logit_softcapping": "an elementwise op on the attention scores",
    "final_logit_softcapping": "an elementwise op on the logits",
}
"""Keys whose cost the model leaves out, with what they would change (a note, not a refusal)."""


MAX_CONFIG_BYTES = 1 << 20
"""A config.json is a few KiB (DeepSeek-V3's: 1.7 KiB); a larger file (``/dev/zero``) is refused unread."""
MAX_CONFIG_NUMBER = 2**53
"""Sizes above this (10**400) are no model's and overflow the cost model's float arithmetic."""
MAX_CONFIG_DEPTH = 20


def load(path: str | Path) -> dict:
    """The parsed ``config.json`` at ``path``; ``ValueError`` naming the file when it is not one (unreadable,
    over ``MAX_CONFIG_BYTES``, not UTF-8, not JSON, nested too deep, not one object, a number not finite or
    above ``MAX_CONFIG_NUMBER``)."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES >> 20} MiB: a config.json is a few KiB")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as error:  # UnicodeDecodeError, JSONDecodeError are ValueErrors
        reason = getattr(error, "strerror", None) or (
            "nested too deeply" if isinstance(error, RecursionError) else str(error)[:200]
        )
        raise ValueError(f"--model-config {path}: cannot read a JSON config ({reason})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--model-config {path}: a config.json holds one JSON object, got {type(data).__name__}")
    _check_numbers(data, path)
    return data


def _out_of_range(value: object) -> bool:
    """A number no config.json size can be: not finite, or above ``MAX_CONFIG_NUMBER``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) > MAX_CONFIG_NUMBER or (isinstance(value, float) and not math.isfinite(value))


def _check_numbers(data: dict, path: Path) -> None:
    """Every number finite and within ``MAX_CONFIG_NUMBER``, nesting within ``MAX_CONFIG_DEPTH`` (walked
    without recursion), each named by its key."""
    pending = [(key, value, 1) for key, value in data.items()]
    while pending:
        key, value, depth = pending.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ValueError(f"--model-config {path}: {key!r} is nested more than {MAX_CONFIG_DEPTH} deep")
        if isinstance(value, dict):
            pending.extend((f"{key}.{k}", v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            pending.extend((f"{key}[{i}]", v, depth + 1) for i, v in enumerate(value))
        elif _out_of_range(value):
            shown = repr(value) if isinstance(value, float) else f"a {len(str(abs(value)))}-digit number"
            raise ValueError(f"--model-config {path}: {key!r} must be a finite number below 2**53, got {shown}")


def _int(config: dict, key: str, default: int | None = None, minimum: int = 1) -> int:
    value = config.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"config.json ({config.get('model_type')}): {key!r} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def _is_layer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _attention(config: dict, d: int, heads: int) -> dict:
    fields = {"n_heads": heads, "n_kv_heads": _int(config, "num_key_value_heads", heads)}
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * heads != d:
        fields["attention_head_dim"] = _int(config, "head_dim")
    return fields


def _common(config: dict) -> dict:
    d, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
    return {
        "vocab_size": _int(config, "vocab_size"),
        "d_model": d,
        "n_layers": _int(config, "num_hidden_layers"),
        "gated_ffn": True,
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        **_attention(config, d, heads),
    }


def _window(config: dict, model_type: str, n_layers: int) -> dict:
    """Mistral's and Mixtral's sliding window (every layer), Qwen2's (``use_sliding_window``: the layers from
    ``max_window_layers`` on, as its attention picks them)."""
    window = config.get("sliding_window")
    if not window:
        return {}
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if not config.get("use_sliding_window", False):
            return {}
        first = _int(config, "max_window_layers", 0, minimum=0)
        return {"sliding_window": int(window), "sliding_layers": tuple(range(first, n_layers))}
    return {"sliding_window": int(window)}


def _moe_layers(n_layers: int, first_dense: int, every: int) -> tuple[int, ...]:
    """DeepSeekMoE's rule (its DecoderLayer): a MoE where layer >= first_k_dense_replace and layer % freq == 0."""
    return tuple(layer for layer in range(first_dense, n_layers) if layer % every == 0)


def _qwen_moe(config: dict, model_type: str) -> dict:
    fields = _common(config)
    dense_only = config.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(_is_layer(layer) for layer in dense_only):
        raise ValueError(
            f"config.json ({model_type}): 'mlp_only_layers' must be a list of layer indices >= 0, got {dense_only!r}"
        )
    # HF Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: MoE where not in mlp_only_layers and (layer + 1) % step == 0
    step = _int(config, "decoder_sparse_step", 1)
    moe = tuple(layer for layer in range(fields["n_layers"]) if layer not in dense_only and (layer + 1) % step == 0)
    shared = _int(config, "shared_expert_intermediate_size", 0, minimum=0)
    dense_hidden = _int(config, "intermediate_size", 0 if len(moe) == fields["n_layers"] else None, minimum=0)
    return fields | {
        "ffn_hidden": dense_hidden,
        "moe_layers": moe,
        "num_experts": _int(config, "num_experts"),
        "top_k": _int(config, "num_experts_per_tok"),
        "moe_hidden": _int(config, "moe_intermediate_size"),
        "shared_expert_hidden": shared,
        "shared_expert_gate": bool(shared),
        "attention_bias": model_type == "qwen2_moe",
        "qk_norm": model_type == "qwen3_moe",
    }


def _deepseek(config: dict, model_type: str) -> dict:
    fields = _common(config)
    moe_hidden = _int(config, "moe_intermediate_size")
    layers = _moe_layers(
        fields["n_layers"], _int(config, "first_k_dense_replace", 0, minimum=0), _int(config, "moe_layer_freq", 1)
    )
    fields |= {
        "ffn_hidden": _int(config, "intermediate_size"),
        "moe_layers": layers,
        "num_experts": _int(config, "n_routed_experts"),
        "top_k": _int(config, "num_experts_per_tok"),
        "moe_hidden": moe_hidden,
        "shared_expert_hidden": _int(config, "n_shared_experts", 0, minimum=0) * moe_hidden,
        "mtp_layers": _int(config, "num_nextn_predict_layers", 0, minimum=0),
    }
    if config.get("kv_lora_rank"):
        fields |= {
            "q_lora_rank": _int(config, "q_lora_rank", 0, minimum=0) if config.get("q_lora_rank") else 0,
            "kv_lora_rank": _int(config, "kv_lora_rank"),
            "qk_rope_head_dim": _int(config, "qk_rope_head_dim"),
            "qk_nope_head_dim": _int(config, "qk_nope_head_dim"),
            "v_head_dim": _int(config, "v_head_dim"),
            "attention_head_dim": 0,
        }
    if config.get("topk_group") and config.get("n_group"):
        fields["ep_node_limit"] = _int(config, "topk_group")
    return fields


def _family_fields(config: dict, model_type: str) -> dict:
    if model_type in DENSE_TYPES:
        fields = _common(config) | {"ffn_hidden": _int(config, "intermediate_size")}
        fields |= _window(config, model_type, fields["n_layers"])
        return fields | {
            "attention_bias": model_type == "qwen2" or bool(config.get("attention_bias", False)),
            "qk_norm": model_type == "qwen3",
        }
    if model_type == "mixtral":
        fields = _common(config)
        return (
            fields
            | _window(config, model_type, fields["n_layers"])
            | {
                "ffn_hidden": 0,
                "moe_layers": tuple(range(fields["n_layers"])),
                "num_experts": _int(config, "num_local_experts"),
                "top_k": _int(config, "num_experts_per_tok"),
                "moe_hidden": _int(config, "intermediate_size"),
            }
        )
    if model_type in QWEN_MOE_TYPES:
        return _qwen_moe(config, model_type)
    if model_type in DEEPSEEK_TYPES:
        return _deepseek(config, model_type)
    if model_type == "opt":
        return _opt(config)
    if model_type == "bloom":
        return _bloom(config)
    d = _int(config, "n_embd")
    return {
        "vocab_size": _int(config, "vocab_size"),
        "d_model": d,
        "n_heads": _int(config, "n_head"),
        "n_layers": _int(config, "n_layer"),
        "ffn_hidden": _int(config, "n_inner", 4 * d) if config.get("n_inner") is not None else 4 * d,
        "linear_bias": True,
        "tied_embeddings": True,
        "position_embeddings": _int(config, "n_positions", 1024),
    }


def _opt(config: dict) -> dict:
    """OPT (Zhang et al. 2022): a GPT-style decoder, ReLU feed-forward of ffn_dim, learned positions with an
    offset of 2 (OPTLearnedPositionalEmbedding), every linear and LayerNorm with a bias, head tied."""
    d = _int(config, "hidden_size")
    projection = config.get("word_embed_proj_dim", d)
    if projection != d:
        raise ValueError(
            f"config.json (opt): word_embed_proj_dim={projection} differs from hidden_size={d} (OPT-350m's "
            "project_in/project_out): not modelled; the cost model reads OPTs whose embedding is hidden_size wide"
        )
    return {
        "vocab_size": _int(config, "vocab_size"),
        "d_model": d,
        "n_heads": _int(config, "num_attention_heads"),
        "n_layers": _int(config, "num_hidden_layers"),
        "ffn_hidden": _int(config, "ffn_dim"),
        "linear_bias": True,
        "tied_embeddings": bool(config.get("tie_word_embeddings", True)),
        "position_embeddings": _int(config, "max_position_embeddings", 2048) + 2,
    }


def _bloom(config: dict) -> dict:
    """BLOOM (BigScience 2022): ALiBi instead of a position table, a LayerNorm after the word embeddings,
    a 4 h GELU feed-forward, biases everywhere, head tied to the embedding."""
    d = _int(config, "hidden_size", config.get("n_embed"))
    return {
        "vocab_size": _int(config, "vocab_size"),
        "d_model": d,
        "n_heads": _int(config, "n_head", config.get("num_attention_heads")),
        "n_layers": _int(config, "n_layer", config.get("num_hidden_layers")),
        "ffn_hidden": 4 * d,
        "linear_bias": True,
        "tied_embeddings": True,
        "embedding_norm": True,
    }


READ_KEYS = {
    "common": {
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "num_key_value_heads",
        "vocab_size",
        "head_dim",
    },
    "llama": {"intermediate_size", "attention_bias", "sliding_window"},
    "mistral": {"intermediate_size", "sliding_window"},
    "qwen2": {"intermediate_size", "sliding_window", "use_sliding_window", "max_window_layers"},
    "qwen3": {"intermediate_size", "sliding_window", "use_sliding_window", "max_window_layers", "attention_bias"},
    "mixtral": {"intermediate_size", "num_local_experts", "num_experts_per_tok", "sliding_window"},
    "qwen2_moe": {
        "intermediate_size",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "num_experts",
        "num_experts_per_tok",
        "decoder_sparse_step",
        "mlp_only_layers",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
    },
    "deepseek": {
        "intermediate_size",
        "moe_intermediate_size",
        "n_routed_experts",
        "n_shared_experts",
        "num_experts_per_tok",
        "first_k_dense_replace",
        "moe_layer_freq",
        "num_nextn_predict_layers",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "topk_group",
        "n_group",
    },
    "gpt2": {"n_embd", "n_layer", "n_head", "n_inner"},
    "opt": {"ffn_dim", "word_embed_proj_dim"},
    "bloom": {"n_embed", "n_layer", "n_head"},
}
READ_KEYS["qwen3_moe"] = READ_KEYS["qwen2_moe"] | {"attention_bias"}
for _name in DEEPSEEK_TYPES:
    READ_KEYS[_name] = READ_KEYS["deepseek"]


def _model_type(config: dict) -> str:
    model_type = config.get("model_type")
    if model_type is None and "n_embd" in config:
        model_type = "gpt2"
    if model_type not in KNOWN_TYPES:
        raise ValueError(
            f"config.json: model_type {model_type!r} is not one the cost model reads; known: {', '.join(KNOWN_TYPES)} "
            "(a dense SwiGLU model with Llama's keys can be given model_type 'llama')"
        )
    return model_type


def unread_notes(config: dict, model_type: str) -> tuple[str, ...]:
    """The notes on keys the cost model does not read (module docstring): by name, never silently."""
    read = READ_KEYS["common"] | READ_KEYS[model_type]
    notes = []
    for key in sorted(config):
        if key in read or key in NO_COST:
            continue
        if key in COST_NOT_MODELLED:
            notes.append(f"config.json key {key!r} is not modelled: {COST_NOT_MODELLED[key]}")
        else:
            notes.append(
                f"config.json key {key!r} is not read by the cost model ({model_type}): if it changes the "
                "model's shapes, the plan does not show it"
            )
    return tuple(notes)


def model_fields(config: dict) -> dict:
    """``ModelConfig`` keyword arguments for a parsed config.json (module docstring); ``precision`` by name."""
    model_type = _model_type(config)
    fields = _family_fields(config, model_type)
    context_key = next(
        (key for key in ("max_position_embeddings", "n_positions", "seq_length") if config.get(key)), None
    )
    context = _int(config, context_key) if context_key else None
    name = config.get("_name_or_path") or model_type
    shape = f"{fields['n_layers']} layers, d {fields['d_model']}, {fields['n_heads']} heads"
    if fields.get("n_kv_heads", fields["n_heads"]) != fields["n_heads"]:
        shape += f" / {fields['n_kv_heads']} K/V heads"
    if fields.get("kv_lora_rank"):
        shape += f" (MLA, K/V rank {fields['kv_lora_rank']})"
    if fields.get("moe_layers"):
        shape += f", {len(fields['moe_layers'])} MoE layers of {fields['num_experts']} experts top-{fields['top_k']}"
    if fields.get("mtp_layers"):
        shape += f", {fields['mtp_layers']} MTP module(s)"
    if fields.get("sliding_window"):
        shape += f", sliding window {fields['sliding_window']}"
    return fields | {
        "name": name,
        "description": f"{model_type} config.json: {shape}, vocab {fields['vocab_size']}",
        "seq_len": min(int(context or DEFAULT_SEQ_LEN), DEFAULT_SEQ_LEN),
        "global_batch": DEFAULT_GLOBAL_BATCH,
        "precision": "bf16-adam",
        "notes": unread_notes(config, model_type),
    }
