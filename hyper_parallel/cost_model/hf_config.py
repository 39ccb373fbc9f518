"""A Hugging Face ``config.json`` read into the cost model's model description (``ModelConfig`` fields).

So a reviewer plans their own model (``python -m launch plan --model-config config.json``) instead of
the nearest preset. The families read, and what is taken from each (every other key is ignored):

    llama, mistral, qwen2   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    (dense, SwiGLU)         num_key_value_heads (GQA), vocab_size, tie_word_embeddings; q/k/v biases:
                            Qwen2 always, Llama when ``attention_bias``
    mixtral                 every layer a MoE of ``num_local_experts`` SwiGLU experts of
                            ``intermediate_size``, ``num_experts_per_tok`` routed per token
    qwen2_moe               MoE layers every ``decoder_sparse_step`` (but ``mlp_only_layers``) of ``num_experts``
                            experts of ``moe_intermediate_size``, a shared expert of
                            ``shared_expert_intermediate_size`` with its sigmoid gate, q/k/v biases
    deepseek, deepseek_v2,  the first ``first_k_dense_replace`` layers dense (``intermediate_size``), then
    deepseek_v3             a MoE every ``moe_layer_freq`` of ``n_routed_experts`` experts of
                            ``moe_intermediate_size`` plus ``n_shared_experts`` shared ones (one shared
                            expert of n_shared x moe_intermediate_size); multi-head latent attention
                            (``kv_lora_rank``) is refused, it is not modelled
    gpt2                    n_embd, n_layer, n_head, n_inner (default 4 n_embd), GELU MLP, learned
                            positions (n_positions), LayerNorm and Conv1D biases, head tied to the embedding

A config.json holds no training settings: the model gets seq_len = min(context, 4096), a global batch
of 1024 sequences and bf16 mixed precision with Adam (``bf16-adam``) unless the caller gives others
(``ModelConfig.from_hf_config(config, seq_len=..., global_batch=...)``; ``--seq-len``, ``--batch``).
Torch-free and no download: the file is read as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

DENSE_TYPES = ("llama", "mistral", "qwen2")
DEEPSEEK_TYPES = ("deepseek", "deepseek_v2", "deepseek_v3")
KNOWN_TYPES = (*DENSE_TYPES, "mixtral", "qwen2_moe", *DEEPSEEK_TYPES, "gpt2")
DEFAULT_SEQ_LEN = 4096
DEFAULT_GLOBAL_BATCH = 1024


def load(path: str | Path) -> dict:
    """The parsed ``config.json`` at ``path``; ``ValueError`` naming the file when it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--model-config {path}: cannot read a JSON config ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--model-config {path}: a config.json holds one JSON object, got {type(data).__name__}")
    return data


def _int(config: dict, key: str, default: int | None = None, minimum: int = 1) -> int:
    value = config.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"config.json ({config.get('model_type')}): {key!r} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def _attention(config: dict, d: int, heads: int) -> dict:
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * heads != d:
        raise ValueError(
            f"config.json: head_dim={head_dim} x num_attention_heads={heads} != hidden_size={d}; the cost model "
            "takes head_dim = hidden_size / heads"
        )
    return {"n_heads": heads, "n_kv_heads": _int(config, "num_key_value_heads", heads)}


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


def _moe_layers(n_layers: int, first_dense: int, every: int) -> tuple[int, ...]:
    """DeepSeekMoE's rule (its DecoderLayer): a MoE where layer >= first_k_dense_replace and layer % freq == 0."""
    return tuple(layer for layer in range(first_dense, n_layers) if layer % every == 0)


def _family_fields(config: dict, model_type: str) -> dict:
    if model_type in DENSE_TYPES:
        fields = _common(config) | {"ffn_hidden": _int(config, "intermediate_size")}
        return fields | {"attention_bias": model_type == "qwen2" or bool(config.get("attention_bias", False))}
    if model_type == "mixtral":
        fields = _common(config)
        return fields | {
            "ffn_hidden": 0,
            "moe_layers": tuple(range(fields["n_layers"])),
            "num_experts": _int(config, "num_local_experts"),
            "top_k": _int(config, "num_experts_per_tok"),
            "moe_hidden": _int(config, "intermediate_size"),
        }
    if model_type == "qwen2_moe":
        fields = _common(config)
        dense_only = tuple(config.get("mlp_only_layers") or ())
        # HF Qwen2MoeDecoderLayer: MoE where layer not in mlp_only_layers and (layer + 1) % step == 0
        step = _int(config, "decoder_sparse_step", 1)
        moe = tuple(layer for layer in range(fields["n_layers"]) if layer not in dense_only and (layer + 1) % step == 0)
        return fields | {
            "ffn_hidden": _int(config, "intermediate_size"),
            "moe_layers": moe,
            "num_experts": _int(config, "num_experts"),
            "top_k": _int(config, "num_experts_per_tok"),
            "moe_hidden": _int(config, "moe_intermediate_size"),
            "shared_expert_hidden": _int(config, "shared_expert_intermediate_size", 0, minimum=0),
            "shared_expert_gate": bool(config.get("shared_expert_intermediate_size", 0)),
            "attention_bias": True,
        }
    if model_type in DEEPSEEK_TYPES:
        if config.get("kv_lora_rank") or config.get("q_lora_rank"):
            raise ValueError(
                "config.json: multi-head latent attention (kv_lora_rank / q_lora_rank, DeepSeek-V2/V3) is not "
                "modelled; the cost model reads DeepSeekMoE-style configs with standard attention"
            )
        fields = _common(config)
        moe_hidden = _int(config, "moe_intermediate_size")
        layers = _moe_layers(
            fields["n_layers"], _int(config, "first_k_dense_replace", 0, minimum=0), _int(config, "moe_layer_freq", 1)
        )
        return fields | {
            "ffn_hidden": _int(config, "intermediate_size"),
            "moe_layers": layers,
            "num_experts": _int(config, "n_routed_experts"),
            "top_k": _int(config, "num_experts_per_tok"),
            "moe_hidden": moe_hidden,
            "shared_expert_hidden": _int(config, "n_shared_experts", 0, minimum=0) * moe_hidden,
        }
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


def model_fields(config: dict) -> dict:
    """``ModelConfig`` keyword arguments for a parsed config.json (module docstring); ``precision`` by name."""
    model_type = _model_type(config)
    fields = _family_fields(config, model_type)
    context = config.get("max_position_embeddings") or config.get("n_positions") or DEFAULT_SEQ_LEN
    name = config.get("_name_or_path") or model_type
    shape = f"{fields['n_layers']} layers, d {fields['d_model']}, {fields['n_heads']} heads"
    if fields.get("n_kv_heads", fields["n_heads"]) != fields["n_heads"]:
        shape += f" / {fields['n_kv_heads']} K/V heads"
    if fields.get("moe_layers"):
        shape += f", {len(fields['moe_layers'])} MoE layers of {fields['num_experts']} experts top-{fields['top_k']}"
    return fields | {
        "name": name,
        "description": f"{model_type} config.json: {shape}, vocab {fields['vocab_size']}",
        "seq_len": min(int(context), DEFAULT_SEQ_LEN),
        "global_batch": DEFAULT_GLOBAL_BATCH,
        "precision": "bf16-adam",
    }
