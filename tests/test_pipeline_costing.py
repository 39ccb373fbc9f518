"""Pipeline parallelism costed (hyper_parallel.cost_model.stages, step_time): the layers, memory,
collectives and bubble of every stage against numbers derived by hand here.

The model: 8 layers, d 64, 4 heads (kv = d), plain feed-forward F 128, vocab 256, seq 32, fp32 Adam, 8
sequences per step. On 4 ranks with pp = 4 (dp = 1) and micro-batch 1 there are m = 8 microbatches of
32 tokens. One layer's saved activations per token (memory.py, tp = cp = 1): norms 2d, colwise inputs
2d, q and the attention output 2d, k and v 2d, the feed-forward hidden and activation 2F = 8d + 2F = 768
elements, 4 B each: 32 x 768 x 4 = 98,304 B per microbatch; the head's float32 logits 32 x 256 x 4 =
32,768 B, three of them while a microbatch's loss runs its backward (the stack is torchtitan's: torch's
cross_entropy holds the saved log-softmax, its gradient and the input gradient), one (the saved
log-softmax) for every other microbatch whose backward is pending. torch.distributed.pipelining (the
stack's, as of torchtitan's benchmarks) also keeps every microbatch's stage output all step: 32 x 64 x 4 =
8,192 B per microbatch and stage, the last stage's being its logits as the head emits them (32,768 B). Two
layers per rank (one per chunk with two chunks per rank when interleaved).
"""

from __future__ import annotations

import pytest
from conftest import result_of

from hyper_parallel import ParallelDims
from hyper_parallel.cost_model import PRECISIONS, ModelConfig, estimate, get_model
from hyper_parallel.cost_model.hardware import get_hardware
from hyper_parallel.cost_model.pipeline import bubble_fraction, plan_lines
from hyper_parallel.cost_model.stages import rank_layers
from hyper_parallel.cost_model.step_time import estimate_step
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.recipes import RECIPES

TOY = ModelConfig(
    "toy",
    vocab_size=256,
    d_model=64,
    n_heads=4,
    n_layers=8,
    ffn_hidden=128,
    seq_len=32,
    global_batch=8,
    precision=PRECISIONS["fp32-adam"],
    micro_batch=1,
)
LAYER, LOGITS, OUTPUT = 32 * (8 * 64 + 2 * 128) * 4, 32 * 256 * 4, 32 * 64 * 4
KEPT = 8 * OUTPUT  # the m = 8 outputs a stage keeps all step
PP4 = ParallelDims(world_size=4, pp=4)


def test_layers_embedding_and_head_per_stage():
    """Chunks of 8 / 4 = 2 layers in order; interleaved with 2 stages per rank, 8 chunks of 1 layer, chunk j on
    rank j mod 4: rank 0 holds layers 0 and 4. The embedding is on rank 0, the final norm and head on rank 3."""
    assert rank_layers(TOY, 4) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    interleaved = TOY.replace(pp_schedule="interleaved_1f1b", virtual_stages=2)
    assert rank_layers(interleaved, 4) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    stages = estimate(TOY, PP4).stages
    names = [{f"{u.name}.{p.name}" for u in s.units for p in u.params if u.is_root} for s in stages]
    assert names == [{"root.tok_embeddings.weight"}, set(), set(), {"root.norm.weight", "root.output.weight"}]
    assert (
        sum(u.global_numel for s in stages for u in s.units)
        == estimate(TOY, ParallelDims(world_size=4)).parameter_count
    )


@pytest.mark.parametrize(
    "schedule, virtual, expected",
    [
        # GPipe: all m = 8 microbatches in flight on every stage; the last holds 7 saved log-softmaxes and
        # the 3 copies of the loss running its backward
        # the 3 copies of the loss running its backward; every rank keeps its stage's 8 outputs (the last
        # rank's are the 8 logits)
        ("gpipe", 1, [8 * 2 * LAYER + KEPT] * 3 + [8 * 2 * LAYER + (7 + 3) * LOGITS + 8 * LOGITS]),
        # 1F1B: min(m, pp - r) = 4, 3, 2, 1; the last rank: its loss's 3 copies and the 8 logits it keeps
        ("1f1b", 1, [4 * 2 * LAYER + KEPT, 3 * 2 * LAYER + KEPT, 2 * 2 * LAYER + KEPT, 2 * LAYER + 11 * LOGITS]),
        # interleaved, v = 2: chunks min(m v, 2 (pp - r - 1) + (v - 1) pp + 1) = 11, 9, 7, 5, each half the
        # rank's two layers: 5.5, 4.5, 3.5 and 2.5 microbatches of the rank's activations; the head's logits
        # live from the last stage's forward to its backward, which follows it: one microbatch's three copies;
        # each rank keeps the 8 outputs of both its stages, the last rank's second stage's being the logits
        (
            "interleaved_1f1b",
            2,
            [5.5 * 2 * LAYER + 2 * KEPT, 4.5 * 2 * LAYER + 2 * KEPT, 3.5 * 2 * LAYER + 2 * KEPT]
            + [2.5 * 2 * LAYER + 3 * LOGITS + KEPT + 8 * LOGITS],
        ),
    ],
)
def test_stage_activations_hold_the_microbatches_in_flight(schedule, virtual, expected):
    config = TOY.replace(pp_schedule=schedule, virtual_stages=virtual)
    cost = estimate(config, PP4)
    assert [s.memory.activations for s in cost.stages] == [int(e) for e in expected]
    worst = max(cost.stages, key=lambda s: s.memory.total)
    assert cost.memory == worst.memory  # the plan reports the worst stage


@pytest.mark.parametrize("schedule, virtual", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)])
def test_bubble_is_the_schedules_fraction_of_the_step(schedule, virtual):
    """step = m t + (pp - 1) / v x t with t the slowest stage's busy time per microbatch: the bubble is
    (pp - 1) / (v m + pp - 1) of the step, 3/11 for GPipe and 1F1B, 3/19 interleaved."""
    config = TOY.replace(pp_schedule=schedule, virtual_stages=virtual)
    step = estimate_step(estimate(config, PP4), 4, get_hardware("h100-sxm"))
    slowest = max(step.stage_seconds)
    assert step.bubble_seconds == pytest.approx(3 / virtual * slowest / 8, rel=1e-12)
    assert step.seconds == pytest.approx(slowest + step.bubble_seconds, rel=1e-12)
    assert step.bubble_seconds / step.seconds == pytest.approx(bubble_fraction(schedule, 4, 8, virtual), rel=1e-12)
    assert step.bubble_seconds / step.seconds == pytest.approx(3 / (8 * virtual + 3), rel=1e-12)


def test_fsdp_reduces_once_per_step_and_keeps_the_stage_gathered():
    """8 ranks, pp 2 x dp_shard 4: 8 / 4 = 2 rows per rank, m = 2 microbatches of 1 row. Rank 0 holds layers 0-3 and the embedding:
    five units. Gradients are reduced once per step: 5 reduce-scatters (not 2 x 5). With reshard after
    forward, 1F1B on stage 0 runs F0 F1 B0 B1: both warm-up forwards all-gather each layer (2 x 4, plus the
    root once, which never reshards), then the parameters stay gathered after B0 (no reshard after
    backward), so only B0 all-gathers: 4. Without reshard after forward, once per unit. At the peak every
    unit is gathered and its unsharded gradients accumulate: buffer x (4 + 4) B."""
    config = TOY
    dims = ParallelDims(world_size=8, dp_shard=4, pp=2)
    stage = estimate(config, dims).stages[0]
    counts = {(c.op, c.phase): c.count for c in stage.collectives if c.group == "fsdp"}
    assert counts[("reduce_scatter", "backward")] == 5
    assert counts[("all_gather", "forward")] == 2 * 4 + 1 and counts[("all_gather", "backward")] == 4
    kept = estimate(config.replace(reshard_after_forward=False), dims).stages[0]
    counts = {(c.op, c.phase): c.count for c in kept.collectives if c.group == "fsdp"}
    assert counts == {("all_gather", "forward"): 5, ("reduce_scatter", "backward"): 5}
    assert stage.memory.gathered == sum(u.gathered_numel for u in stage.units) * 8


@pytest.mark.parametrize("gpus_per_node, crosses", [(8, True), (16, False)])
def test_p2p_runs_on_the_link_between_stages(gpus_per_node, crosses):
    """16 ranks, pp 2: a stage is 8 contiguous ranks, so rank r's peer is r + 8: another node with 8 GPUs per
    node (inter-node bandwidth, 45 GB/s), the same node with 16 (360 GB/s). Rank 0 sends m = 2 microbatches
    of 1 x 32 x 64 x 4 B forward: 16,384 B."""
    h100 = get_hardware("h100-sxm")
    config = TOY.replace(global_batch=16)
    step = estimate_step(estimate(config, ParallelDims(world_size=16, dp_shard=8, pp=2)), gpus_per_node, h100)
    sends = [c for c in step.timed if c.group == "pp" and c.op == "send"]
    assert sum(c.bytes for c in sends) == 2 * 32 * 64 * 4
    speed = (h100.inter_node_gbs if crosses else h100.intra_node_gbs) * 1e9
    assert all(c.crosses_nodes == crosses and c.seconds == pytest.approx(c.bytes / speed) for c in sends)


def test_pp_changes_memory_and_time():
    """The issue's first complaint: --pp changed nothing. llama-8b-like with tp 8 x dp_shard 8, then the same
    with pp 4 on 4 x as many ranks: a rank holds a quarter of the layers, so its sharded state is about a
    quarter of pp 1's (plus the embedding or the head on the end stages: below 0.4), and the step gets a bubble."""
    config = get_model("llama-8b-like").replace(micro_batch=1)
    flat = estimate(config, ParallelDims(world_size=64, tp=8))
    piped = estimate(config, ParallelDims(world_size=256, tp=8, pp=4))
    state = lambda m: m.parameters + m.gradients + m.optimizer  # noqa: E731
    assert state(piped.memory) < 0.4 * state(flat.memory)
    assert estimate_step(piped, 8, get_hardware("h100-sxm")).bubble_seconds > 0


def test_plan_lines_shard_the_boundary_tensor_with_sequence_parallelism():
    """TP 8 uses SP by default (sequence_parallel None): the hidden states crossing a boundary are sharded by
    tp, 2 x 8192 / 8 x 4096 x 2 B = 16 MiB, not 128 MiB (the issue's 8x)."""
    dims = ParallelDims(world_size=8192, tp=8, pp=4)
    text = "\n".join(plan_lines(get_model("llama-8b-like"), dims))
    assert "(16.00 MiB per microbatch each way)" in text
    text = "\n".join(plan_lines(get_model("llama-8b-like").replace(sequence_parallel=False), dims))
    assert "(128.00 MiB per microbatch each way)" in text


@pytest.mark.distributed
@pytest.mark.parametrize("recipe, schedule", [("P1", "1f1b"), ("P1-G", "gpipe")])
def test_stage_collectives_equal_the_traced_pipeline_runs(recipe, schedule, recipe_results):
    """The recipes' pipeline runs (the mini transformer with 4 layers, pp 2 x dp_shard 2, 4 microbatches of
    one row, fp32) against the cost model's stages: every rank's P2P bytes by (op, phase), its FSDP
    all-gather bytes (the recipes keep every unit gathered from its first forward to the step's end, as
    torchtitan does under PP: one all-gather per unit per step) and its one reduce-scatter per unit per step,
    equal the traced step's bytes."""
    degrees = RECIPES[recipe].default
    result = result_of(recipe, degrees, recipe_results)
    assert result.ok, result.error
    dims = ParallelDims(**degrees)
    notes = result.metrics["notes"]
    assert (notes["schedule"], notes["microbatches"]) == (schedule, 4)
    config = get_model("small").replace(
        n_layers=4, micro_batch=8 // dims.dp // 4, pp_schedule=schedule, reshard_after_forward=False
    )
    stages = estimate(config, dims).stages
    for rank, events in result.traces.items():
        traced: dict[tuple[str, str], float] = {}
        for e in events:
            if e["kind"] == "collective" and e["step"] == 1 and e["group"] in ("pp", "fsdp"):
                phase = "backward" if e["op"] == "reduce_scatter" else e["phase"]  # traced after backward
                traced[(e["op"], phase)] = traced.get((e["op"], phase), 0) + e["bytes"]
        stage = stages[dims.coordinates(rank)[MeshDim.PP]]
        modelled = {(c.op, c.phase): c.bytes for c in stage.collectives if c.group in ("pp", "fsdp")}
        assert traced == modelled, (rank, traced, modelled)
