"""Notebook 02_memory: its predictions are the cost model's, and a run measures the same bytes.

The predictions (``launch.notebook.memory_lesson``) are checked against counts derived by hand for M4's MLP
(d_in 16, d_model 32, hidden 64, d_out 8, 2 blocks, biases; Adam; 2 ranks): the root unit holds
inp (16*32 + 32) + head (32*8 + 8) = 808 parameters, each block norm 32 + w1 (32*64 + 64) + w2
(64*32 + 32) = 4224, 9256 in all. The run (``hyper_parallel.benchmark.memory_probe`` on 2 torchrun
ranks) must equal them part by part; its saved activations must equal the same forward in one process
on the rank's rows (sharding does not change what autograd saves).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from worker_results import run_worker

from hyper_parallel.cost_model import PRECISIONS, estimate, get_model
from hyper_parallel.mesh import ParallelDims
from launch.notebook.memory_lesson import bytes_per_parameter, comparison_rows, predicted, zero_stages

ROOT, BLOCK = 16 * 32 + 32 + 32 * 8 + 8, 32 + 32 * 64 + 64 + 64 * 32 + 32
TOTAL = ROOT + 2 * BLOCK
FP32, ADAM = 4, 8


def test_the_parts_of_a_prediction_are_counted_by_hand():
    assert (ROOT, BLOCK, TOTAL) == (808, 4224, 9256)
    default = predicted(2)
    assert default["parameters"] == default["gradients"] == TOTAL * FP32 // 2 == 18512
    assert default["optimizer"] == TOTAL * ADAM // 2
    assert default["kept_gathered"] == ROOT * FP32  # only the root keeps its parameters after forward
    assert (default["all_gathers"], default["reduce_scatters"]) == (3 + 2, 3)
    no_reshard = predicted(2, reshard_after_forward=False)
    assert no_reshard["kept_gathered"] == TOTAL * FP32
    assert (no_reshard["all_gathers"], no_reshard["reduce_scatters"]) == (3, 3)
    accumulated = predicted(2, micro_batches=2)  # every micro-batch gathers and reduces
    assert (accumulated["all_gathers"], accumulated["reduce_scatters"]) == (10, 6)
    assert accumulated["saved_activations"] * 2 == default["saved_activations"]


def test_bytes_per_parameter_and_zero_stages():
    """16 B per parameter with or without bf16 compute; 05.2's 120 GiB is 16 B x 8.03e9 parameters;
    each ZeRO stage keeps less, stage 3 about 16 B / dp."""
    assert bytes_per_parameter(PRECISIONS["bf16-adam"])["total kept"] == 4 + 4 + 8
    assert bytes_per_parameter(PRECISIONS["fp32-adam"])["total kept"] == 16
    assert bytes_per_parameter(PRECISIONS["bf16-adam"])["gathered compute copy (transient)"] == 2
    llama = get_model("llama-8b-like")
    count = estimate(llama, ParallelDims(world_size=1)).parameter_count
    stages = list(zero_stages(llama, 64).values())
    assert stages[0] == 16 * count and 119 < stages[0] / 2**30 < 121
    assert stages[1] == 8 * count + 8 * count // 64 and stages[2] == 4 * count + 12 * count // 64
    assert stages == sorted(stages, reverse=True)
    assert stages[3] == pytest.approx(16 * count / 64, rel=1e-3)  # padding only
    small = replace(llama, n_layers=2)
    assert list(zero_stages(small, 1).values()) == [zero_stages(small, 1)["ZeRO-0 (DDP)"]] * 4


def test_comparison_rows_mark_exact_parts_and_the_activation_estimate():
    measured = dict(predicted(2), saved_activations=predicted(2)["saved_activations"] // 2, optimizer=1)
    rows = {row[0]: row[3] for row in comparison_rows(measured, predicted(2))}
    assert rows["parameters"] == "✔ equal" and rows["optimizer"] == "✘ differs"
    assert rows["saved activations"] == "estimate; measured/model 0.50"


@pytest.mark.distributed
def test_a_run_on_two_ranks_measures_what_the_cost_model_predicts(tmp_path):
    from hyper_parallel.benchmark.memory_probe import new_model, rank_rows, saved_activation_bytes

    for rank, runs in enumerate(run_worker("memory_probe_worker", 2, tmp_path, "memory", timeout=300)):
        for name, options in (("default", {}), ("no reshard", {"reshard_after_forward": False})):
            expected = predicted(2, **options)
            for part in ("parameters", "gradients", "optimizer", "kept_gathered", "all_gathers", "reduce_scatters"):
                assert runs[name][part] == expected[part], (rank, name, part)
        accumulated = predicted(2, micro_batches=2)
        assert (runs["2 micro-batches"]["all_gathers"], runs["2 micro-batches"]["reduce_scatters"]) == (10, 6)
        assert runs["2 micro-batches, one sync"]["reduce_scatters"] == 3  # reduced once, after the last
        assert runs["2 micro-batches"]["parameters"] == accumulated["parameters"]
        assert runs["2 micro-batches"]["saved_activations"] * 2 == runs["default"]["saved_activations"]
        x, y = rank_rows(rank, 2)  # cloned as the probe does: a view would save the whole batch's storage
        for name, checkpointed in (("default", False), ("checkpointed", True)):
            _, alone = saved_activation_bytes(new_model(checkpointed=checkpointed), x.clone(), y.clone())
            assert runs[name]["saved_activations"] == alone, (rank, name)
        assert runs["checkpointed"]["saved_activations"] < runs["default"]["saved_activations"] / 2
        estimate_ratio = runs["default"]["saved_activations"] / predicted(2)["saved_activations"]
        assert 0.8 < estimate_ratio < 1.2  # the cost model's estimate of this eager MLP (measured 0.95)


def test_the_memory_bars_tick_at_round_kib():
    """02's bars once ticked at 48.8 / 97.7 / 146.5 KiB (round numbers of bytes): the ticks are round KiB."""
    from hyper_parallel.viz.memory import PART_COLORS, memory_bars

    parts = dict(zip(PART_COLORS, (36_000, 36_000, 0, 3_300, 104_000)))
    fig = memory_bars({"M4": (parts, parts)})
    fig.canvas.draw()
    axis = fig.axes[0].xaxis
    low, high = axis.get_view_interval()
    labels = [tick.get_text() for tick in axis.get_ticklabels() if low <= tick.get_position()[0] <= high]
    assert labels and all(label.endswith(" KiB") for label in labels), labels
    values = [float(label.split()[0]) for label in labels]
    assert values[:4] == [0, 50, 100, 150], labels  # 179.0 KiB in all: steps of 50 KiB
