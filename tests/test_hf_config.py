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

DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json in Hugging Face's key names
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 3,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_nextn_predict_layers": 1,
    "vocab_size": 129280,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}
OPT_125M = {
    "model_type": "opt",
    "hidden_size": 768,
    "ffn_dim": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
    "word_embed_proj_dim": 768,
}
BLOOM_176B = {"model_type": "bloom", "hidden_size": 14336, "n_layer": 70, "n_head": 112, "vocab_size": 250880}
QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
}
MISTRAL_7B = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "sliding_window": 4096,
    "max_position_embeddings": 32768,
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
        (
            DEEPSEEK_MOE_16B | {"model_type": "deepseek_v3", "kv_lora_rank": 512},
            "'qk_rope_head_dim' must be an integer",
        ),
        (OPT_125M | {"word_embed_proj_dim": 512}, "word_embed_proj_dim=512 differs from hidden_size=768"),
    ],
)
def test_configs_the_model_cannot_describe_are_refused(config, message):
    """Latent attention without its head dimensions, and OPT-350m's embedding projection, are refused."""
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


def _deepseek_v3_by_hand(mtp: bool) -> int:
    """MLA: wq_a d x 1536, its norm, wq_b 1536 x 128 (128 + 64), wkv_a d x (512 + 64), its norm, wkv_b 512 x 128
    (128 + 128), wo 128 x 128 x d; 3 dense layers of 3 d 18432, 58 MoE layers of 256 routed and one shared
    expert of 3 d 2048 and a router 256 x d; two norms a layer; untied embedding and head, final norm. The MTP
    module: a MoE layer, two norms and eh_proj 2 d x d."""
    d = 7168
    mla = d * 1536 + 1536 + 1536 * 128 * 192 + d * 576 + 512 + 512 * 128 * 256 + 128 * 128 * d
    moe = 257 * 3 * d * 2048 + 256 * d
    main = 3 * (mla + 3 * d * 18432 + 2 * d) + 58 * (mla + moe + 2 * d) + 2 * 129280 * d + d
    return main + (mla + moe + 2 * d + 2 * d + 2 * d * d if mtp else 0)


def test_new_families_count_their_parameters_by_hand():
    """DeepSeek-V3: 671B without its MTP module (the report's 671B; deepseek-ai/DeepSeek-V3's README counts the
    module's 14B with its own embedding and head copies). BLOOM-176B: l (12 h^2 + 13 h) + v h + 4 h
    (bigscience tr11-176B-ml README). OPT: per layer 4 d^2 + 4 d (q, k, v, out and biases), 2 d F + F + d
    (fc1, fc2), 4 d (two LayerNorms); tied head, 2048 + 2 learned positions, final LayerNorm. Qwen3-MoE: q
    32 x 128 wide, k and v 4 x 128, q/k norms of 128, 128 experts and a router, no shared expert."""
    deepseek = ModelConfig.from_hf_config(DEEPSEEK_V3)
    assert parameter_count(deepseek) == _deepseek_v3_by_hand(mtp=True)
    assert parameter_count(deepseek.replace(mtp_layers=0)) == _deepseek_v3_by_hand(mtp=False)
    assert float(f"{_deepseek_v3_by_hand(mtp=False):.3g}") == 671e9
    h, layers, v = 14336, 70, 250880
    assert parameter_count(ModelConfig.from_hf_config(BLOOM_176B)) == layers * (12 * h**2 + 13 * h) + v * h + 4 * h
    d, f = 768, 3072
    opt = 12 * (4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d) + 50272 * d + 2050 * d + 2 * d
    assert parameter_count(ModelConfig.from_hf_config(OPT_125M)) == opt
    d, q, kv = 2048, 32 * 128, 4 * 128
    layer = d * q + 2 * d * kv + q * d + 2 * 128 + 2 * d + 128 * 3 * d * 768 + 128 * d
    assert parameter_count(ModelConfig.from_hf_config(QWEN3_MOE)) == 4 * layer + 2 * 151936 * d + d


def test_what_changes_cost_is_read_and_the_rest_is_named():
    """DeepSeek-V3's MLA, MTP and node-limited routing (at most 4 groups: one per node under EP across nodes)
    are read; its fp8 quantization_config is named as not modelled; a key nothing reads is named, never dropped."""
    deepseek = ModelConfig.from_hf_config(DEEPSEEK_V3)
    assert (deepseek.kv_lora_rank, deepseek.mtp_layers, deepseek.ep_node_limit, deepseek.head_dim) == (512, 1, 4, 192)
    assert any("'quantization_config' is not modelled" in note for note in deepseek.notes)
    odd = ModelConfig.from_hf_config(LLAMA_3_8B | {"frobnication_layers": 3})
    assert any("'frobnication_layers' is not read" in note for note in odd.notes)
    assert not ModelConfig.from_hf_config(LLAMA_3_8B).notes  # every key of Llama's config is read or costs nothing


def test_sliding_window_attention_costs_the_window():
    """Mistral 7B at a 32,768-token sequence with its 4,096-token window: per token and layer, attention's q k^T
    and its values count 4 x 4096 x d, not 4 x 32768 x d. The matmuls per token: 32 x 2 (2 d^2 + 2 d 1024 +
    3 d 14336) + 2 d 32000 = 14.22 GFLOP; with attention 17.18 GFLOP unwindowed, 2.15 windowed: 1.92x."""
    from hyper_parallel.cost_model.compute import forward_flops_per_token

    mistral = ModelConfig.from_hf_config(MISTRAL_7B, seq_len=32768)
    windowed = forward_flops_per_token(mistral)
    full = forward_flops_per_token(mistral.replace(sliding_window=0))
    assert windowed["attention_core"] == 32 * 4 * 4096 * 4096 and full["attention_core"] == 32 * 4 * 32768 * 4096
    d, matmuls = 4096, 32 * 2 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 2 * 4096 * 32000
    assert sum(windowed.values()) == matmuls + 32 * 4 * 4096 * d
    assert sum(full.values()) / sum(windowed.values()) == pytest.approx(1.92, abs=0.005)
