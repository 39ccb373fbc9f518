"""Your own model from its Hugging Face config.json: ``ModelConfig.from_hf_config`` on configs written
here (the fields of the published config.json files; no download), its parameter count derived by hand
from the architecture and equal to the published size, and ``plan --model-config`` on such a file.

Parameter counts by hand (d hidden, F feed-forward, V vocab, L layers, kv = K/V heads x head_dim):
    Llama-3-8B      L (2 d^2 + 2 d kv + 3 d F + 2 d) + 2 V d + d, untied head      = 8,030,261,248  (8.03B)
    Mixtral-8x7B    L (2 d^2 + 2 d kv + 8 x 3 d F + 8 d + 2 d) + 2 V d + d         = 46,702,792,704 (46.7B)
    Qwen1.5-MoE-A2.7B  L (4 d^2 + 3 d [q/k/v biases] + 60 x 3 d F_e + 3 d F_s + 60 d [router] + d
                    [shared gate] + 2 d) + 2 V d + d                               = 14,315,784,192 (14.3B)
    GPT-2           L (12 d^2 + 13 d) + V d [tied head] + 1024 d [positions] + 2 d         = 124,439,808 (124M)
    DeepSeekMoE-16B 1 dense layer (4 d^2 + 3 d F + 2 d) + 27 MoE layers (4 d^2 + 64 x 3 d F_e + 2 x 3 d F_e
                    [two shared experts] + 64 d + 2 d) + 2 V d + d                 = 16,375,728,128 (16.4B)
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from hyper_parallel import ParallelDims
from hyper_parallel.cost_model import ModelConfig, estimate, get_model, load_model_config
from hyper_parallel.cost_model.units import parameter_count
from launch import cli

LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
MIXTRAL_8X7B = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}
QWEN_MOE_A27B = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
GPT2 = {
    "model_type": "gpt2",
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "n_positions": 1024,
    "vocab_size": 50257,
}
DEEPSEEK_MOE_16B = {
    "model_type": "deepseek",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 102400,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def _llama_by_hand() -> int:
    d, kv, f, v, layers = 4096, 8 * 128, 14336, 128256, 32
    return layers * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + 2 * v * d + d


def _mixtral_by_hand() -> int:
    d, kv, f, v, layers, experts = 4096, 8 * 128, 14336, 32000, 32, 8
    return layers * (2 * d * d + 2 * d * kv + experts * 3 * d * f + experts * d + 2 * d) + 2 * v * d + d


def _qwen_moe_by_hand() -> int:
    d, fe, fs, v, layers, experts = 2048, 1408, 5632, 151936, 24, 60
    layer = 4 * d * d + 3 * d + experts * 3 * d * fe + 3 * d * fs + experts * d + d + 2 * d
    return layers * layer + 2 * v * d + d


def _gpt2_by_hand() -> int:
    """c_attn [d, 3d] + 3d, c_proj [d, d] + d, c_fc [d, 4d] + 4d, c_proj [4d, d] + d, two LayerNorms 2 x 2d;
    wte V d (tied head), wpe 1024 d, ln_f 2 d."""
    d, v, layers = 768, 50257, 12
    layer = 3 * d * d + 3 * d + d * d + d + 4 * d * d + 4 * d + 4 * d * d + d + 4 * d
    return layers * layer + v * d + 1024 * d + 2 * d


def _deepseek_by_hand() -> int:
    d, f, fe, v = 2048, 10944, 1408, 102400
    dense = 4 * d * d + 3 * d * f + 2 * d
    moe = 4 * d * d + 64 * 3 * d * fe + 2 * 3 * d * fe + 64 * d + 2 * d
    return dense + 27 * moe + 2 * v * d + d


@pytest.mark.parametrize(
    "config, by_hand, published",
    [
        (LLAMA_3_8B, _llama_by_hand, 8.03e9),
        (MIXTRAL_8X7B, _mixtral_by_hand, 46.7e9),
        (QWEN_MOE_A27B, _qwen_moe_by_hand, 14.3e9),
        (GPT2, _gpt2_by_hand, 124e6),
        (DEEPSEEK_MOE_16B, _deepseek_by_hand, 16.4e9),
    ],
    ids=["llama-3-8b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "gpt2", "deepseek-moe-16b"],
)
def test_parameter_count_equals_the_hand_count_and_the_published_size(config, by_hand, published):
    model = ModelConfig.from_hf_config(config)
    assert parameter_count(model) == by_hand()
    assert float(f"{parameter_count(model):.3g}") == published  # published sizes have three digits


def test_the_families_read_their_own_fields():
    """Mixtral: every layer MoE, top-2 of 8; Qwen2-MoE: shared expert with its gate and q/k/v biases;
    DeepSeekMoE: layer 0 dense, two shared experts of 1408 as one of 2816; GPT-2: LayerNorm and linear
    biases, learned positions, tied head; a sequence of min(context, 4096) tokens and bf16 Adam."""
    mixtral = ModelConfig.from_hf_config(MIXTRAL_8X7B)
    assert (mixtral.moe_layers, mixtral.num_experts, mixtral.top_k, mixtral.moe_hidden) == (
        tuple(range(32)),
        8,
        2,
        14336,
    )
    qwen = ModelConfig.from_hf_config(QWEN_MOE_A27B)
    assert qwen.shared_expert_gate and qwen.attention_bias and qwen.shared_expert_hidden == 5632
    deepseek = ModelConfig.from_hf_config(DEEPSEEK_MOE_16B)
    assert deepseek.moe_layers == tuple(range(1, 28)) and deepseek.shared_expert_hidden == 2816
    gpt2 = ModelConfig.from_hf_config(GPT2, global_batch=64)
    assert gpt2.linear_bias and gpt2.tied_embeddings and gpt2.position_embeddings == 1024 and not gpt2.gated_ffn
    assert (gpt2.seq_len, gpt2.global_batch, gpt2.precision.name) == (1024, 64, "bf16-adam")
    assert ModelConfig.from_hf_config(MIXTRAL_8X7B).seq_len == 4096


@pytest.mark.parametrize(
    "config, message",
    [
        ({"model_type": "mamba"}, "model_type 'mamba' is not one the cost model reads"),
        (LLAMA_3_8B | {"num_hidden_layers": 0}, "'num_hidden_layers' must be an integer >= 1, got 0"),
        (DEEPSEEK_MOE_16B | {"model_type": "deepseek_v3", "kv_lora_rank": 512}, "multi-head latent attention"),
        (LLAMA_3_8B | {"head_dim": 64}, "head_dim=64 x num_attention_heads=32 != hidden_size=4096"),
    ],
)
def test_configs_the_model_cannot_describe_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_config(config)


def test_presets_are_config_files_read_the_same_way():
    """llama-8b-like is configs/llama-8b-like.json through from_hf_config: the same numbers as the config
    written here with the preset's training settings."""
    preset = get_model("llama-8b-like")
    mine = ModelConfig.from_hf_config(LLAMA_3_8B, name="llama-8b-like", seq_len=8192, global_batch=512)
    assert preset.replace(description="") == mine.replace(description="")


def test_plan_model_config_reads_your_file(tmp_path):
    """plan --model-config on a Mixtral config.json: the JSON plan's parameters and memory equal
    estimate() on from_hf_config of the same dict."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL_8X7B), encoding="utf-8")
    out = io.StringIO()
    args = ["plan", "--world", "64", "--ep", "8", "--model-config", str(path), "--batch", "64", "--json"]
    with contextlib.redirect_stdout(out):
        assert cli.main(args) == 0
    doc = json.loads(out.getvalue())["plan"]
    cost = estimate(load_model_config(path, global_batch=64), ParallelDims(world_size=64, ep=8))
    assert doc["parameters"] == 46_702_792_704 == cost.parameter_count
    assert doc["memory"]["total"] == cost.memory.total
    bad = tmp_path / "broken.json"
    bad.write_text("{not json", encoding="utf-8")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert cli.main(["plan", "--world", "8", "--model-config", str(bad)]) == 2
    assert "cannot read a JSON config" in err.getvalue()
