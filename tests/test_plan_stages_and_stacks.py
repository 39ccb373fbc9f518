"""The planner's runs as teams ran them, against numbers derived by hand here: uneven pipeline stages and V
placement, the schedules' bubbles and microbatches in flight, ZeRO-1/2, what a stack keeps for backward,
float8, and the command line that plans Llama 3 405B as its Table 4 ran it."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from test_pipeline_costing import TOY as PIPELINE_TOY

from hyper_parallel import ParallelDims
from hyper_parallel.cost_model import PRECISIONS, estimate, get_model
from hyper_parallel.cost_model.communication import counts
from hyper_parallel.cost_model.hardware import get_hardware
from hyper_parallel.cost_model.memory import activation_bytes
from hyper_parallel.cost_model.pipeline import (
    alive_microbatches,
    bubble_fraction,
    edge_stages,
    layer_ranges,
    plan_lines,
    stage_layer_counts,
)
from hyper_parallel.cost_model.stages import rank_layers
from hyper_parallel.cost_model.step_time import estimate_step
from hyper_parallel.cost_model.work import gemm_seconds
from launch import cli

TOY = PIPELINE_TOY.replace(precision=PRECISIONS["bf16-adam"])


def plan(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["plan", *args])
    return code, out.getvalue(), err.getvalue()


def test_uneven_splits_as_the_teams_ran_them():
    """torchtitan's generated split: 126 layers on 16 stages = base 7, 14 left over for the 14 middle stages:
    7, 8 x 14, 7. Megatron's first/last: 7 and 7 leave 112 for 14 middle stages of 8. BLOOM's
    'transformer|embedding': 70 layers on 12, the end stages one short. Llama 3's: 128 stages, the first and
    last empty (embedding, output), 126 of one layer."""
    assert stage_layer_counts(126, 16) == (7,) + (8,) * 14 + (7,) == edge_stages(16, 1, 7, 7, 126)
    assert stage_layer_counts(70, 12, (5,) + (6,) * 10 + (5,)) == (5,) + (6,) * 10 + (5,)
    assert edge_stages(16, 8, 0, 0, 126) == (0,) + (1,) * 126 + (0,)
    text = plan_lines(get_model("llama-405b-like").replace(micro_batch=1), ParallelDims(world_size=2048, pp=16))
    assert "pp=16 stages of 7, 8 x 14, 7 layers" in text[0]
    with pytest.raises(ValueError, match="must give 12 stages"):
        stage_layer_counts(70, 12, (6,) * 11)
    with pytest.raises(ValueError, match="each stage needs a layer"):
        stage_layer_counts(8, 16)


def test_v_schedules_place_the_first_and_last_stage_on_rank_0():
    """zbv / dualpipev on pp = 4 with 8 one-layer stages: rank r holds stages r and 7 - r (torch's style="v"),
    so rank 0 holds layers 0 and 7; loop placement (interleaved) holds r and r + 4."""
    v = TOY.replace(pp_schedule="zbv", virtual_stages=2)
    assert rank_layers(v, 4) == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert rank_layers(TOY.replace(pp_schedule="interleaved_1f1b", virtual_stages=2), 4) == [
        (0, 4),
        (1, 5),
        (2, 6),
        (3, 7),
    ]
    stages = estimate(v, ParallelDims(world_size=4, pp=4)).stages
    assert stages[0].first and stages[0].last and not (stages[3].first or stages[3].last)
    assert layer_ranges((0, 1, 2, 3, 64, 65, 66, 67)) == "0-3, 64-67"


@pytest.mark.parametrize(
    "schedule, v, bubble, alive",
    [
        # b = (p - 1) x factor, fraction b / (m + b) with p = 4, m = 8
        ("interleaved_zb", 2, 3 / 6, (1 * 4 + 2 * 3 + 1) / 2),  # factor 1 / (3 v); torch's warm-up (v-1) N + 2(p-1) + 1
        ("zbv", 2, 3 / 6, 4),  # factor 1 / 6; as many in flight as 1F1B's first stage
        ("dualpipev", 2, 3 / 3, 4.5),  # factor 1 / 3 (DualPipe's table); PP + 1 stages = p + 1/2 rank units
    ],
)
def test_zero_bubble_and_dualpipe_schedules_by_hand(schedule, v, bubble, alive):
    assert bubble_fraction(schedule, 4, 8, v) == pytest.approx(bubble / (8 + bubble))
    assert alive_microbatches(schedule, 4, 8, 0, v) == pytest.approx(alive)


def test_dualpipev_hides_the_expert_all_to_all_that_1f1b_waits_for():
    """A MoE model on pp 2 x ep 4: 1F1B waits for every EP all-to-all; DualPipeV overlaps them with the paired
    chunk's compute, so none of it waits while the compute is longer."""
    moe = get_model("moe-16e").replace(global_batch=64, micro_batch=1)
    dims = ParallelDims(world_size=16, pp=2, ep=4)
    h100 = get_hardware("h100-sxm")
    one = estimate_step(estimate(moe, dims), 8, h100).middle
    dual = estimate_step(estimate(moe.replace(pp_schedule="dualpipev", virtual_stages=2), dims), 8, h100).middle
    assert one.exposed_by_group["ep"] > 0 and dual.exposed_by_group["ep"] == 0


def test_zero_1_and_2_shard_what_zero_says_and_communicate_once_per_step():
    """The toy (bf16-adam: 4 B parameters and gradients, 8 B optimizer) on dp_shard = 4 with 8 micro-batches:
    ZeRO-1 keeps parameters and gradients whole and a quarter of the optimizer; ZeRO-2 a quarter of the
    gradients too. ZeRO-1 reduce-scatters once per step, ZeRO-2 once per micro-batch, both all-gather the
    updated parameters once after the step; neither all-gathers in forward or backward."""
    dims = ParallelDims(world_size=4)
    full = estimate(TOY.replace(zero=3), ParallelDims(world_size=1)).memory
    m = TOY.accumulation(dims)[1]
    for zero in (1, 2):
        cost = estimate(TOY.replace(zero=zero), dims)
        assert cost.memory.parameters == full.parameters
        assert cost.memory.optimizer == pytest.approx(full.optimizer / 4, rel=0.05)  # padding to 4 shards
        expected_gradients = full.gradients if zero == 1 else full.gradients / 4
        assert cost.memory.gradients == pytest.approx(expected_gradients, rel=0.05)
        calls = counts(cost.collectives)
        assert calls[("reduce_scatter", "fsdp", "backward")] == (1 if zero == 1 else m) * 9  # 8 layers + root
        assert calls[("all_gather", "fsdp", "step")] == 9
        assert ("all_gather", "fsdp", "forward") not in calls


def test_megatron_sequence_parallelism_keeps_the_colwise_inputs_sharded():
    """Per token of one toy layer on tp = 4 with SP: torchtitan's DTensor SP keeps the two colwise inputs
    all-gathered (2 d), Megatron's the sequence shards (2 d / 4); a fused SwiGLU keeps 3 F / tp instead of 4:
    1.5 d + F / 4 elements fewer, 2 B each. Megatron's unfused attention (2021, no flash kernel) keeps its
    scores instead: 5 B (softmax output, dropout mask and output) per score, 4 heads / 4 = 1 head x 32 keys
    per token: 160 B more per token."""
    dims = ParallelDims(world_size=4, tp=4)
    gated = TOY.replace(gated_ffn=True, global_batch=1, micro_batch=None)
    titan = activation_bytes(gated, dims, (0,), head=False)
    megatron = activation_bytes(gated.replace(stack="megatron"), dims, (0,), head=False)
    tokens = 32
    assert titan - megatron == tokens * 2 * (2 * 64 * 3 / 4 + 128 / 4) - tokens * 1 * 32 * 5


def test_an_embedding_norm_keeps_its_input_on_the_first_stage():
    """BLOOM's embedding LayerNorm sits outside every (checkpointed) layer: the first stage keeps its input,
    d = 64 elements of 2 B per token, for each of the 3 microbatches in flight; no other stage does."""
    dims = ParallelDims(world_size=1)
    bloomish = TOY.replace(embedding_norm=True, global_batch=1, micro_batch=None, activation_checkpointing="full")
    first = activation_bytes(bloomish, dims, (0,), head=False, alive=3, first=True)
    other = activation_bytes(bloomish, dims, (0,), head=False, alive=3, first=False)
    assert first - other == 3 * 32 * 64 * 2


def test_float8_runs_the_layer_gemms_at_the_fp8_peak_and_gathers_one_byte():
    h100 = get_hardware("h100-sxm")
    assert gemm_seconds(4096, 4096, 4096, h100, float8=True) == pytest.approx(
        gemm_seconds(4096, 4096, 4096, h100) * 989 / 1979
    )
    with pytest.raises(ValueError, match="no float8 peak"):
        gemm_seconds(1, 1, 1, get_hardware("a100-sxm-80gb"), float8=True)
    dims = ParallelDims(world_size=8)
    plain = estimate(get_model("llama-8b-like"), dims).by_op_group()[("all_gather", "fsdp")]
    fp8 = estimate(get_model("llama-8b-like").replace(float8=True), dims).by_op_group()[("all_gather", "fsdp")]
    assert fp8 == pytest.approx(plain / 2)


LLAMA3_TABLE_4 = [
    "--world", "8192", "--tp", "8", "--pp", "16", "--dp-shard", "64", "--model", "llama-405b-like",
    "--hardware", "h100-sxm", "--batch", "2048", "--micro-batch", "1", "--pp-schedule", "interleaved-1f1b",
    "--virtual-stages", "8", "--first-stage-layers", "0", "--last-stage-layers", "0",
    "--reshard-after-forward", "false", "--stack", "llama3", "--loss-parallel",
]  # fmt: skip


def test_plan_runs_llama_3_405b_as_table_4_ran_it():
    """Llama 3 405B (126 layers) on 8,192 H100 SXM: TP 8 x PP 16 x DP 64, the first and last stage without
    layers, no activation checkpointing at 8K: within 20 % of Table 4's 430 TFLOP/s per GPU, and it fits."""
    code, out, err = plan(*LLAMA3_TABLE_4, "--json")
    assert code == 0, err
    doc = json.loads(out)["plan"]
    assert doc["fits"], doc["memory"]
    assert abs(doc["step"]["model_tflops_per_gpu"] / 430 - 1) <= 0.2
    chunks = [s["layers"] for s in doc["stage_memory"]]  # stage s = rank s mod 16; stage 0 only the embedding
    assert chunks[0][:2] == [[], [15, 15]] and chunks[1][:2] == [[0, 0], [16, 16]]


def test_compare_ranks_the_layouts_when_the_default_one_does_not_divide_the_batch():
    """llama-8b-like on 64 ranks with a global batch of 4: tp 8 leaves dp 8, which 4 sequences do not divide;
    --compare still ranks every layout that does (dp 4, 2 or 1) and says why the given one is not among them."""
    code, out, err = plan("--world", "64", "--tp", "8", "--model", "llama-8b-like", "--batch", "4", "--compare")
    assert code == 0, err
    assert "the layout given (dp_shard=8, tp=8) is not one" in out and "valid layouts of 64 ranks" in out
    code, _, err = plan("--world", "64", "--tp", "8", "--model", "llama-8b-like", "--batch", "4")
    assert code == 2 and "global_batch" in err


def test_ring_cp_waits_only_for_what_the_sends_exceed_the_attention_by():
    """llama-8b-like on cp 4 (8k tokens): all-gather CP's K/V collectives are the next op's input, so the step
    waits for all of them; the ring's sends travel while the block in hand is attended, so it waits for
    max(0, sends - attention), from the same timed collectives and the same attention time."""
    h100, dims = get_hardware("h100-sxm"), ParallelDims(world_size=32, dp_shard=8, cp=4)
    config = get_model("llama-8b-like").replace(global_batch=8)
    gathered = estimate_step(estimate(config, dims), 8, h100)
    ring = estimate_step(estimate(config.replace(sequence_scheme="ring"), dims), 8, h100)
    assert gathered.middle.exposed_by_group["cp"] == pytest.approx(
        sum(c.seconds for c in gathered.timed if c.group == "cp")
    )
    sends = sum(c.seconds for c in ring.timed if c.group == "cp")
    waited = max(0.0, sends - ring.middle.work.attention)
    assert sends > 0 and ring.middle.exposed_by_group.get("cp", 0.0) == pytest.approx(waited)
    slow = get_hardware("h100-sxm").replace(intra_node_gbs=1.0, inter_node_gbs=1.0)  # sends far above the attention
    slow_ring = estimate_step(estimate(config.replace(sequence_scheme="ring"), dims), 8, slow)
    slow_sends = sum(c.seconds for c in slow_ring.timed if c.group == "cp")
    assert slow_ring.middle.exposed_by_group["cp"] == pytest.approx(slow_sends - slow_ring.middle.work.attention)


def test_compare_can_choose_each_layouts_sequence_scheme_and_schedule():
    """With ``choose`` each layout runs the fastest of its variants (every scheme on cp > 1, every schedule on
    pp > 1): never slower than the model as given, and the variant named is the one recomputed by hand."""
    from hyper_parallel.cost_model.ranking import rank_layouts, variants

    h100, config = get_hardware("h100-sxm"), get_model("llama-8b-like")
    given = {r.dims: r for r in rank_layouts(config, 32, 8, h100)}
    chosen = rank_layouts(config, 32, 8, h100, choose=True)
    assert {r.dims for r in chosen} >= set(given)
    for r in chosen:
        if r.dims in given and given[r.dims].fits and r.fits:
            assert r.step_seconds <= given[r.dims].step_seconds * (1 + 1e-12)
    sample = next(r for r in chosen if r.dims.cp > 1 and r.dims.pp > 1)
    by_hand = []
    for label, variant in variants(config.replace(micro_batch=1), sample.dims):
        try:
            cost = estimate(variant, sample.dims)
        except ValueError:
            continue
        fits = cost.memory.total <= h100.budget_bytes
        by_hand.append((not fits, estimate_step(cost, 8, h100).seconds, cost.memory.total, label))
    assert min(by_hand)[3] == sample.choice and min(by_hand)[1] == pytest.approx(sample.step_seconds)
    code, out, err = plan(
        "--world", "32", "--model", "llama-8b-like", "--dp-shard", "32", "--compare", "--choose", "--top", "40"
    )
    assert code == 0 and any(f"[{name}" in out for name in ("all_gather", "ring", "ulysses")), out
    code, _, err = plan("--world", "32", "--model", "llama-8b-like", "--dp-shard", "32", "--choose")
    assert code == 2 and "--compare" in err


def test_only_all_gather_cp_keeps_the_other_ranks_kv_for_backward():
    """llama-8b-like on cp 4, no checkpointing: all-gather CP keeps the 3 K/V blocks it gathered per layer,
    2 x kv x (cp - 1) elements per token (kv = 8 K/V heads x 128 = 1024 on tp 1), in bf16; the ring and
    Ulysses keep none, so their activations are exactly that much smaller."""
    dims = ParallelDims(world_size=32, dp_shard=8, cp=4)
    config = get_model("llama-8b-like").replace(global_batch=8)
    tokens = 1 * config.seq_len // 4  # one sequence per dp rank, its cp share
    per_token_and_layer = 2 * 1024 * 3 * 2  # 2 kv x (cp - 1) elements x 2 B
    gathered = estimate(config, dims).memory.activations
    for scheme in ("ring", "ulysses"):
        kept = estimate(config.replace(sequence_scheme=scheme), dims).memory.activations
        assert gathered - kept == tokens * config.n_layers * per_token_and_layer, scheme


def test_llama3_all_gather_cp_gathers_the_kv_again_in_backward_instead_of_keeping_them():
    """Meta's stack (TransformerEngine's AttnFuncWithCPAndKVAllGather, after Llama 3's section 3.3.2) keeps
    only its own K/V and all-gathers them again in backward: its activations equal the ring's (which keeps
    no gathered copy), and its cp traffic adds a backward all-gather of the forward's bytes."""
    dims = ParallelDims(world_size=32, dp_shard=8, cp=4)
    config = get_model("llama-8b-like").replace(global_batch=8, stack="llama3")
    gathered, ring = estimate(config, dims), estimate(config.replace(sequence_scheme="ring"), dims)
    assert gathered.memory.activations == ring.memory.activations
    by_key = {(c.op, c.phase): c.bytes for c in gathered.collectives if c.group == "cp"}
    kv = 2 * config.seq_len * 1024 * 2 * config.n_layers  # K and V of the whole 8192-token sequence, 1024 wide, bf16
    assert by_key == {("all_gather", "forward"): kv, ("all_gather", "backward"): kv, ("reduce_scatter", "backward"): kv}


def test_deepseek_v3_moe_layer_keeps_what_its_report_caches():
    """One MoE layer of DeepSeek-V3 under HAI-LLM's FP8 (report sections 3.2.3 and 3.3.3), per token, in bf16
    elements (a float8 byte = 0.5): the layer input 7168; the down-projections' float8 input 7168 x 0.5 (the
    RMSNorm output is recomputed); the latents c_q 1536 and c_kv 512 before and after their norms plus the
    rotary key 64, in float8: (2 x 1536 + 2 x 512 + 64) x 0.5; the attention output in E5M6, 128 heads x 128 x
    0.75 (q, k, v recomputed from the latents); the feed-forward norm's input 7168 (the router's input is
    recomputed); per routed expert (8) its dispatched float8 row 7168 x 0.5 and its SwiGLU input 2 x 2048 x 0.5
    (the output recomputed and weighted there, so no expert output is kept); the shared expert the same once."""
    from hyper_parallel.cost_model.calibration import deepseek_v3_model

    model = deepseek_v3_model()
    dims = ParallelDims(world_size=2048, dp_shard=128, pp=16, ep=64)
    fp8 = 0.5
    attention = 7168 + 7168 * fp8 + (2 * 1536 + 2 * 512 + 64) * fp8 + 128 * 128 * 0.75
    experts = 8 * (7168 * fp8 + 2 * 2048 * fp8) + (7168 * fp8 + 2 * 2048 * fp8)
    per_token = attention + 7168 + experts
    layer = (model.moe_layers[0],)
    assert activation_bytes(model, dims, layer, head=False, first=False) == 4096 * per_token * 2
