"""The compute and overlap model (hyper_parallel.cost_model.compute, step_time) against hand arithmetic and
published formulas: the 6 N + attention training-FLOPs rule, Megatron-LM's FLOPs formula with and without
recomputation, activation checkpointing's extra forward and saved activations, and the step's overlap."""

from __future__ import annotations

import pytest

from hyper_parallel import ParallelDims
from hyper_parallel.cost_model import PRECISIONS, ModelConfig, estimate, get_model
from hyper_parallel.cost_model.compute import step_flops
from hyper_parallel.cost_model.hardware import get_hardware
from hyper_parallel.cost_model.step_time import estimate_step
from hyper_parallel.cost_model.work import gemm_seconds, work_time

LLAMA = get_model("llama-8b-like")
D, KV, F, V, L, S = 4096, 8 * 128, 14336, 128256, 32, 8192


def test_llama_8b_flops_per_token_are_6n_plus_the_attention_term():
    """By hand, Llama-3-8B shapes: N = 32 (2 d^2 + 2 d kv + 3 d F + 2 d) + 2 V d + d = 8,030,261,248
    parameters (tests/test_cost_model.py); the embedding table (V d = 525,336,576) is a lookup, not a
    matmul, so N_matmul = N - V d = 7,504,924,672. Training FLOPs per token: 6 N_matmul (forward 2 N,
    backward 4 N) + 12 L s d for attention (q k^T and attention x v, 2 s d each forward, times 3)
    = 45.03e9 + 12.88e9 = 57.91e9. The model counts matmul by matmul (and the norms' 2 d per layer do
    nothing): within 2 %."""
    n = L * (2 * D * D + 2 * D * KV + 3 * D * F + 2 * D) + 2 * V * D + D
    assert n == 8_030_261_248
    by_hand = 6 * (n - V * D) + 12 * L * S * D
    dims = ParallelDims(world_size=512, dp_shard=512)
    flops = step_flops(LLAMA, dims)
    per_token = flops.model * dims.world_size / (LLAMA.global_batch * LLAMA.seq_len)
    assert per_token == pytest.approx(by_hand, rel=0.02)
    assert per_token == pytest.approx(57.91e9, rel=1e-3)
    assert flops.recompute == 0 and flops.total == flops.model  # no AC: nothing recomputed
    # per rank: 8192 tokens of one sequence on each of 512 ranks, ~4.7e14 FLOPs (the hand estimate 5e14)
    assert flops.total == pytest.approx(per_token * S, rel=1e-12) == pytest.approx(4.74e14, rel=0.01)


@pytest.mark.parametrize("ac, megatron", [("none", 72), ("full", 96)])
def test_gpt_flops_equal_megatron_lm_formula(ac, megatron):
    """Narayanan et al. 2021 (Efficient Large-Scale Language Model Training on GPU Clusters), eq. 3: a GPT
    (h = d, feed-forward 4h, no GQA, vocab V) trains B sequences of s tokens in
        72 B s L h^2 (1 + s / 6h + V / 12 L h)   FLOPs without recomputation,
        96 B s L h^2 (1 + s / 6h + V / 16 L h)   with full activation recomputation (the layers' forward again,
                                                  not the head's).
    A GPT-3 1.3B-like shape: h 2048, 24 layers, 16 heads, s 2048, V 51200, B 512."""
    h, layers, s, vocab, batch = 2048, 24, 2048, 51200, 512
    gpt = ModelConfig(
        "gpt-1.3b",
        vocab_size=vocab,
        d_model=h,
        n_heads=16,
        n_layers=layers,
        ffn_hidden=4 * h,
        seq_len=s,
        global_batch=batch,
        precision=PRECISIONS["bf16-adam"],
        activation_checkpointing=ac,
    )
    head = {72: vocab / (12 * layers * h), 96: vocab / (16 * layers * h)}[megatron]
    formula = megatron * batch * s * layers * h**2 * (1 + s / (6 * h) + head)
    dims = ParallelDims(world_size=64, dp_shard=8, tp=8)
    assert step_flops(gpt, dims).total * 64 == pytest.approx(formula, rel=1e-12)


def test_activation_checkpointing_adds_the_forward_and_saves_activations():
    """Full AC recomputes every layer's forward: per token 2 N_layers + 4 L s d (the head is not
    recomputed); selective recomputes the attention core only, 4 L s d per token.
    Saved activations per token (memory.py; tp = cp = 1, so sp = 1; a = 2 bytes), per layer:
        none       attention d + d + 2d + 2 kv, feed-forward d + d + 4F          = 6d + 2kv + 4F
        selective  the attention output and silu / product recomputed: 3d + 2kv + 2d + 2F
        full       d per layer, plus one layer's full set while it is recomputed
        op         torchtitan's save list: the input d, the 1st, 3rd, 5th and 7th matmuls' outputs (wq d,
                   wv kv, w1 F, w2 d), the attention output d and its logsumexp 2 x 32 heads = 2d + kv + F + 2d + 64
    and the float32 logits V * 4 bytes three times in all four: torchtitan's loss is torch's cross_entropy
    on logits.float(), whose backward holds the saved log-softmax, its gradient and the input gradient."""
    dims = ParallelDims(world_size=8, dp_shard=8)
    tokens_per_rank = LLAMA.global_batch * S / 8
    layer_params = 2 * D * D + 2 * D * KV + 3 * D * F
    none, selective, full = (
        step_flops(LLAMA.replace(activation_checkpointing=ac), dims) for ac in ("none", "selective", "full")
    )
    assert full.total - none.total == pytest.approx((2 * L * layer_params + 4 * L * S * D) * tokens_per_rank, rel=1e-12)
    assert full.recompute == pytest.approx(none.forward - 2 * D * V * tokens_per_rank, rel=1e-12)
    assert selective.recompute == pytest.approx(4 * L * S * D * tokens_per_rank, rel=1e-12)
    assert full.model == selective.model == none.model  # MFU counts the model's FLOPs, not the recomputation
    rows = LLAMA.global_batch // 8
    logits = 3 * rows * S * V * 4
    per_layer = {"none": 6 * D + 2 * KV + 4 * F, "selective": 5 * D + 2 * KV + 2 * F}
    expected = {
        "none": L * per_layer["none"],
        "selective": L * per_layer["selective"],
        "full": L * D + per_layer["none"],
        "op": L * (4 * D + KV + F + 64),
    }
    assert 4 * D + KV + F + 64 == 31808  # against 51,200 for Megatron-style selective
    for ac, elements in expected.items():
        memory = estimate(LLAMA.replace(activation_checkpointing=ac), dims).memory
        assert memory.activations == int(rows * S * elements * 2 + logits), ac


def test_per_op_checkpointing_under_tensor_parallelism_by_hand():
    """torchtitan's per-op save list on FSDP 8 x TP 8 with SP and loss parallelism, per token of the TP group's
    sequence and layer: the input d / 8 = 512, wq's output 4096 / 8 = 512, wv's one K/V head 128, w1's
    14336 / 8 = 1792, w2's partial sum before its reduce-scatter, full width 4096, the attention output 512
    and its logsumexp 2 x 32 / 8 = 8, the two reduce-scatters' outputs 2 x 512: 8,584 elements of 2 B. The
    loss: torch's loss-parallel decomposition holds 4 float32 copies of the V / 8 logits."""
    dims = ParallelDims(world_size=64, dp_shard=8, tp=8)
    config = LLAMA.replace(activation_checkpointing="op", loss_parallel=True)
    per_layer = 512 + 512 + 128 + 1792 + 4096 + 512 + 8 + 2 * 512
    assert per_layer == 8584
    tokens = LLAMA.global_batch // 8 * S
    expected = tokens * (L * per_layer * 2 + 4 * V / 8 * 4)
    assert estimate(config, dims).memory.activations == int(expected)


def test_gemm_time_by_hand():
    """A (4096 x 4096) x (4096 x 4096) GEMM on the H100 preset: 2 x 4096^3 FLOPs at 989e12 x gemm_efficiency
    x (4096 / (4096 + 128))^3; a thin one (m = 128) runs at half that rate again on its m axis."""
    h100 = get_hardware("h100-sxm")
    f = 4096 / (4096 + 128)
    assert gemm_seconds(4096, 4096, 4096, h100) == pytest.approx(
        2 * 4096**3 / (989e12 * h100.gemm_efficiency * f**3), rel=1e-12
    )
    thin = gemm_seconds(128, 4096, 4096, h100)
    assert thin == pytest.approx(2 * 128 * 4096**2 / (989e12 * h100.gemm_efficiency * 0.5 * f**2), rel=1e-12)


def test_work_time_of_a_one_layer_model_by_hand():
    """One SwiGLU layer, d 1024, F 4096, 8 heads / 8 K/V heads (kv = d), vocab 32000, one sequence of 2048
    tokens on one GPU, bf16-adam, no checkpointing. GEMMs forward: wq, wk, wv, wo (T, d, d), w1, w3 (T, F, d),
    w2 (T, d, F), head (T, V, d); backward twice: x3. Attention: 4 s d x T / 2 (causal) FLOPs at the
    efficiency of shape (T, s, head_dim 128), x (1 + 2.5). Memory-bound elements per token: 4d + 6d norms and
    residuals, 2 (d + kv) rotary, 3 F activation, x3 (backward twice), 2 B each; the loss 20 B per logit.
    Optimizer: 34 B per parameter element."""
    h100 = get_hardware("h100-sxm")
    d, f, v, t = 1024, 4096, 32000, 2048
    one = ModelConfig(
        "one-layer",
        vocab_size=v,
        d_model=d,
        n_heads=8,
        n_layers=1,
        ffn_hidden=f,
        gated_ffn=True,
        seq_len=t,
        global_batch=1,
        precision=PRECISIONS["bf16-adam"],
    )
    dims = ParallelDims(world_size=1)
    cost = estimate(one, dims)
    work = work_time(one, dims, h100, cost.units)
    g = lambda m, n, k: gemm_seconds(m, n, k, h100)  # noqa: E731
    gemms = 4 * g(t, d, d) + 2 * g(t, f, d) + g(t, d, f)
    assert work.gemm == pytest.approx(3 * gemms + 3 * g(t, v, d), rel=1e-12)
    rate = 989e12 * h100.gemm_efficiency * (t / (t + 128)) ** 2 * (128 / 256)
    assert work.attention == pytest.approx(4 * t * d * t / 2 / rate * 3.5, rel=1e-12)
    memory_rate = 3.35e12 * 0.8
    elements = (4 * d + 6 * d + 2 * (d + d) + 3 * f) * t * 3
    assert work.memory_bound == pytest.approx((elements * 2 + 20 * t * v) / memory_rate, rel=1e-12)
    assert work.optimizer == pytest.approx(cost.parameter_count * 34 / memory_rate, rel=1e-12)


def test_step_time_overlap_by_hand():
    """step = compute + critical + exposed (step_time.py), compute the work's time (work.py).
    TP 8 inside one node: every collective is TP, on the critical path, nothing hidden; the range is the
    compute -+20 %. FSDP 8 inside a node: the all-gathers and reduce-scatter are far below the compute of
    a phase, so only the first stage of the prefetch pipeline shows: exposed = all of it / 33 units
    (32 layers and the root). MFU = model FLOPs / (step x peak)."""
    h100 = get_hardware("h100-sxm")
    cost = estimate(LLAMA, ParallelDims(world_size=8, tp=8))
    tp = estimate_step(cost, 8, h100)
    flops = step_flops(LLAMA, ParallelDims(world_size=8, tp=8))
    work = work_time(LLAMA, cost.dims, h100, cost.units)
    for step, factor in ((tp.fast, 0.8), (tp.middle, 1.0), (tp.slow, 1.2)):
        assert step.compute == pytest.approx(work.total * factor, rel=1e-12)
        assert step.critical == pytest.approx(sum(c.seconds for c in tp.timed), rel=1e-12)
        assert step.exposed == step.hidden == 0
        assert step.total == pytest.approx(step.compute + step.critical, rel=1e-12)
        assert step.mfu == pytest.approx(flops.model / (step.total * 989e12), rel=1e-12)
    fsdp = estimate_step(estimate(LLAMA, ParallelDims(world_size=8, dp_shard=8)), 8, h100)
    comm = sum(c.seconds for c in fsdp.timed)
    assert {c.group for c in fsdp.timed} == {"fsdp"} and comm < fsdp.fast.compute / 3
    assert fsdp.middle.exposed == pytest.approx(comm / 33, rel=1e-12)
    assert fsdp.middle.hidden == pytest.approx(comm * 32 / 33, rel=1e-12) and fsdp.middle.critical == 0


def test_mfu_is_an_output_layouts_of_one_model_differ():
    """The same model and FLOPs on two layouts of 64 ranks: wide TP cuts every GEMM to a thin n or k and
    waits for its collectives, so its MFU is lower than FSDP's; before this model every layout's compute
    was the same FLOPs at one assumed efficiency."""
    h100 = get_hardware("h100-sxm")
    fsdp = estimate_step(estimate(LLAMA, ParallelDims(world_size=64)), 8, h100)
    tp = estimate_step(estimate(LLAMA, ParallelDims(world_size=64, tp=8)), 8, h100)
    assert fsdp.flops.model == pytest.approx(tp.flops.model, rel=1e-12)
    assert tp.middle.compute > fsdp.middle.compute and tp.middle.mfu < fsdp.middle.mfu


def test_kv_heads_repeated_under_wide_tp_are_work_but_not_model_flops():
    """tp=16 > 8 K/V heads: each rank holds one K/V head, so 16 heads are computed where the model has 8.
    Extra forward FLOPs per token of the mesh: L x 2 matrices (wk, wv) x 2 d head_dim x 8 repeated heads;
    MFU's model FLOPs leave them out."""
    dims = ParallelDims(world_size=64, dp_shard=4, tp=16)
    flops = step_flops(LLAMA, dims)
    tokens_per_rank = LLAMA.global_batch * S / 64
    extra = L * 2 * 2 * D * 128 * 8 * tokens_per_rank
    assert flops.forward - flops.model / 3 == pytest.approx(extra, rel=1e-9)
    assert step_flops(LLAMA, ParallelDims(world_size=64, dp_shard=8, tp=8)).forward == pytest.approx(
        flops.model / 3, rel=1e-12
    )
