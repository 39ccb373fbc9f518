"""`python -m launch plan --layouts`: named candidates side by side. The CSV and JSON parse and carry, per
candidate, exactly what ``estimate`` / ``estimate_step`` give for that layout; ties, the Pareto front, the
memory budget, the training knobs and the warnings against hand arithmetic; the HTML page is self-contained."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re

import pytest

from hyper_parallel import ParallelDims
from hyper_parallel.cost_model import estimate, get_model
from hyper_parallel.cost_model.hardware import get_hardware
from hyper_parallel.cost_model.layouts import GIB
from hyper_parallel.cost_model.step_time import estimate_step
from launch import cli

LAYOUTS = "dp_shard=512; dp_replicate=64,dp_shard=8; dp_shard=64,tp=8"
DIMS = [
    ParallelDims(world_size=512, dp_shard=512),
    ParallelDims(world_size=512, dp_replicate=64, dp_shard=8),
    ParallelDims(world_size=512, dp_shard=64, tp=8),
]
BASE = ["--world", "512", "--model", "llama-8b-like", "--gpus-per-node", "8"]


def plan(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["plan", *args])
    return code, out.getvalue(), err.getvalue()


def test_csv_and_json_equal_estimate_per_candidate():
    code, text, err = plan(*BASE, "--layouts", LAYOUTS, "--format", "json")
    assert code == 0, err
    doc = json.loads(text)
    code, text, err = plan(*BASE, "--layouts", LAYOUTS, "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(text)))
    config, h100 = get_model("llama-8b-like"), get_hardware("h100-sxm")
    assert (
        [c["layout"] for c in doc["candidates"]]
        == [r["layout"] for r in rows]
        == ["dp_shard=512", "dp_replicate=64, dp_shard=8", "dp_shard=64, tp=8"]
    )
    for dims, candidate, row in zip(DIMS, doc["candidates"], rows):
        cost = estimate(config, dims)
        step = estimate_step(cost, 8, h100)
        for part, value in cost.memory.as_dict().items():
            assert candidate[f"memory_{part}_bytes"] == value == int(row[f"memory_{part}_bytes"]), part
        assert candidate["comm_bytes"] == sum(c.bytes for c in cost.collectives) == float(row["comm_bytes"])
        assert [(c["op"], c["group"], c["phase"], c["bytes"]) for c in candidate["collectives"]] == [
            (c.op, c.group, c.phase, c.bytes) for c in cost.collectives
        ]
        expected = {
            "step_s": step.seconds,
            "step_fast_s": step.fast.total,
            "step_slow_s": step.slow.total,
            "mfu": step.middle.mfu,
            "flops_per_rank": step.flops.total,
            "exposed_comm_s": step.middle.exposed,
            "critical_comm_s": step.middle.critical,
            "inter_node_bytes": step.inter_node_bytes,
        }
        for key, value in expected.items():
            assert candidate[key] == pytest.approx(value, rel=1e-12) == float(row[key]), key
        assert candidate["fits"] == (cost.memory.total <= (79.6 - 8) * GIB) == (row["fits"] == "True")
    # the reviewer's hand estimate: FSDP 512 is communication-bound at the inter-node bandwidth, HSDP 64x8 hides
    fsdp, hsdp, tp = doc["candidates"]
    assert fsdp["exposed_comm_s"] > 0.2 > hsdp["exposed_comm_s"] and hsdp["rank"] == 1 and fsdp["rank"] == 2
    assert tp["critical_comm_s"] > 0.2 and not tp["fits"] and tp["rank"] == 3


def test_ties_within_the_resolution_and_the_pareto_front():
    """HSDP 64x8 and 64x4 with cp 2 differ by < 5 % in step time: one place, "1=", not an order. Pareto by hand from
    the JSON's (step, memory): a candidate within budget is on the front iff no other one within budget is
    no slower and no larger."""
    code, text, err = plan(
        *BASE,
        "--layouts",
        "dp_replicate=64,dp_shard=8; dp_replicate=64,dp_shard=4,cp=2; dp_shard=512; dp_shard=256,tp=2",
        "--format",
        "json",
    )
    assert code == 0, err
    candidates = json.loads(text)["candidates"]
    a, b = candidates[0], candidates[1]
    assert abs(a["step_s"] - b["step_s"]) < 0.05 * min(a["step_s"], b["step_s"])
    assert (a["rank"], a["tied"], b["rank"], b["tied"]) == (1, True, 1, True)
    for c in candidates:
        dominated = any(
            o is not c
            and o["fits"]
            and o["step_s"] <= c["step_s"]
            and o["memory_total_bytes"] <= c["memory_total_bytes"]
            for o in candidates
        )
        assert c["pareto"] == (c["fits"] and not dominated), c["layout"]
    code, text, _ = plan(
        *BASE, "--layouts", "dp_replicate=64,dp_shard=8; dp_replicate=64,dp_shard=4,cp=2", "--format", "md"
    )
    assert "| 1= | dp_replicate=64, dp_shard=8 |" in text and "| 1= | dp_replicate=64, dp_shard=4, cp=2 |" in text
    assert "a tie, not an order" in text


def test_memory_budget_is_memory_minus_reserve_and_over_budget_is_flagged():
    """TP 8 with 8 sequences resident and loss parallelism: 73.5 GiB of state, layers and one float32 copy of
    the vocabulary-sharded logits (8 x 8192 x 128256 / 8 x 4 B = 3.91 GiB), plus the 3 more copies torch's
    loss-parallel cross entropy holds in its backward (4 in all): 73.5 + 3 x 3.91 = 85.3 GiB. Over 79.6 - 8 =
    71.6 GiB with an 8 GiB reserve; within 90 - 0. Without loss parallelism torch's fused loss holds 3 copies
    of the all-gathered logits (31.3 GiB each) instead of 4 sharded: + 3 x 31.3 - 4 x 3.91 = 78.3 GiB:
    163.6 GiB, over both."""
    sharded = 8 * 8192 * 128256 // 8 * 4 / GIB
    assert sharded == pytest.approx(3.91, abs=0.005)
    lp = ["--layouts", "dp_shard=64,tp=8", "--loss-parallel", "--format", "json", "--memory-reserve-gib", "8"]
    code, text, _ = plan(*BASE, *lp)
    candidate = json.loads(text)["candidates"][0]
    with_lp = candidate["memory_total_bytes"] / GIB
    assert with_lp == pytest.approx(73.5 + 3 * sharded, abs=0.05)
    assert with_lp == pytest.approx(85.3, abs=0.05)
    assert not candidate["fits"]
    assert any(w.startswith("over budget: 85.3 GiB per rank > 71.6 GiB") for w in candidate["warnings"])
    code, text, _ = plan(*BASE, *lp, "--memory-gib", "90", "--memory-reserve-gib", "0")
    assert json.loads(text)["candidates"][0]["fits"]
    code, text, _ = plan(*BASE, "--layouts", "dp_shard=64,tp=8", "--format", "json")
    gathered = json.loads(text)["candidates"][0]["memory_total_bytes"] / GIB
    assert gathered == pytest.approx(with_lp + 3 * 8 * sharded - 4 * sharded, abs=1e-6)
    assert gathered == pytest.approx(163.6, abs=0.05)


def test_training_knobs_by_hand():
    """TP 8 (dp 64, 8 rows per rank). --micro-batch 1: 8 micro-batches, activations of one row (1/8),
    FSDP all-gathers and reduce-scatters 8 times. --loss-parallel: the forward TP all-gather loses the
    logits, 8 x 8192 x 128256 x 2 bytes = 15.66 GiB, and gains 3 all-reduces of 8 x 8192 float32.
    --reshard-after-forward false: no backward all-gather. Memory: without loss parallelism every rank
    holds the all-gathered float32 logits, 8 x 8192 x 128256 x 4 B = 31.3 GiB, three times (torch's fused
    cross entropy); with it 1/8 of them four times (its loss-parallel decomposition): 31.3 x (3 - 4/8)."""
    config = get_model("llama-8b-like")
    dims = DIMS[2]
    base = estimate(config, dims)
    micro = estimate(config.replace(micro_batch=1), dims)
    assert micro.memory.activations == pytest.approx(base.memory.activations / 8, abs=1)
    by_key = lambda cost: {(c.op, c.group, c.phase): c for c in cost.collectives}  # noqa: E731
    for key in [("all_gather", "fsdp", "forward"), ("reduce_scatter", "fsdp", "backward")]:
        assert by_key(micro)[key].bytes == 8 * by_key(base)[key].bytes
    assert by_key(micro)[("all_gather", "tp", "forward")].bytes == by_key(base)[("all_gather", "tp", "forward")].bytes
    loss = by_key(estimate(config.replace(loss_parallel=True), dims))
    logits = 8 * 8192 * 128256 * 2
    assert logits / GIB == pytest.approx(15.66, abs=0.01)
    assert loss[("all_gather", "tp", "forward")].bytes == by_key(base)[("all_gather", "tp", "forward")].bytes - logits
    assert loss[("all_reduce", "tp", "forward")].bytes == 3 * 8 * 8192 * 4
    saved = base.memory.activations - estimate(config.replace(loss_parallel=True), dims).memory.activations
    assert saved == pytest.approx(8 * 8192 * 128256 * 4 * (3 - 4 / 8), abs=2)
    kept = by_key(estimate(config.replace(reshard_after_forward=False), dims))
    assert ("all_gather", "fsdp", "backward") not in kept
    code, _, err = plan(*BASE, "--layouts", "dp_shard=64,tp=8", "--micro-batch", "3")
    assert code == 2 and "micro_batch=3 must divide the 8 rows per rank" in err


def test_padding_inflation_warning_and_expert_shard_dim():
    """moe-16e on FSDP 512 (ep 1, experts inside each block). Per layer, local elements: attention
    2 d^2 + 2 d kv (d 2048, kv 512), norms 2 d, router 16 d, shared expert 3 d 2816, experts 3 x 16 d 1408.
    Sharding axis 0 over 512 pads: experts and router 16 -> 512 rows (x32), shared w1/w3 2816 -> 3072 rows;
    root: embedding and output 32000 -> 32256 rows, norm d. Stored / local = 26.0x. Sharding the
    experts on dim 1 (d = 2048 = 4 x 512) pads nothing there."""
    d, kv = 2048, 512
    local_layer = 2 * d * d + 2 * d * kv + 2 * d + 16 * d + 3 * d * 2816 + 3 * 16 * d * 1408
    padded_layer = 2 * d * d + 2 * d * kv + 2 * d + 512 * d + 2 * 3072 * d + d * 2816 + 3 * 512 * d * 1408
    local = 24 * local_layer + 2 * 32000 * d + d
    padded = 24 * padded_layer + 2 * 32256 * d + d
    ratio = padded / local
    assert round(ratio, 1) == 26.0
    code, text, err = plan("--world", "512", "--model", "moe-16e", "--layouts", "dp_shard=512", "--format", "json")
    assert code == 0, err
    warning = next(w for w in json.loads(text)["candidates"][0]["warnings"] if w.startswith("padding"))
    assert f"{ratio:.1f}x the parameters" in warning and "sharded 512 ways on dim 0 (16 rows)" in warning
    code, text, err = plan(
        "--world",
        "512",
        "--model",
        "moe-16e",
        "--layouts",
        "dp_shard=512",
        "--expert-shard-dim",
        "1",
        "--format",
        "json",
    )
    candidate = json.loads(text)["candidates"][0]
    assert not any(w.startswith("padding") for w in candidate["warnings"])
    stored = estimate(get_model("moe-16e"), ParallelDims(world_size=512, dp_shard=512)).memory.parameters
    assert candidate["memory_parameters_bytes"] < stored / 20


def test_html_review_is_self_contained(tmp_path):
    out = tmp_path / "review.html"
    code, text, err = plan(*BASE, "--layouts", LAYOUTS, "--format", "json", "--out", str(out))
    assert code == 0, err
    assert len(json.loads(text)["candidates"]) == 3 and str(out) in err  # stdout stays one JSON document
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page), "the page must not load anything"
    assert page.count('src="data:image/png;base64,') == 1
    for label in ("dp_shard=512", "dp_replicate=64, dp_shard=8", "dp_shard=64, tp=8"):
        assert f"{label}</h3>" in page
    assert "--layouts" in page  # the command that regenerates it


def test_peak_and_bandwidth_overrides():
    """Half the peak doubles the compute-bound work (GEMMs, attention) and leaves the memory-bound work and
    the optimizer step as they were; the custom numbers name the hardware 'custom'."""
    base = json.loads(plan(*BASE, "--layouts", "dp_shard=512", "--format", "json")[1])
    half = json.loads(
        plan(
            *BASE, "--layouts", "dp_shard=512", "--format", "json", "--peak-tflops", "494.5", "--inter-node-gbs", "90"
        )[1]
    )
    assert half["hardware"]["name"] == "custom"
    b, h = base["candidates"][0], half["candidates"][0]
    assert h["work_gemm_s"] == pytest.approx(2 * b["work_gemm_s"], rel=1e-12)
    assert h["work_attention_s"] == pytest.approx(2 * b["work_attention_s"], rel=1e-12)
    assert h["work_memory_bound_s"] == b["work_memory_bound_s"] and h["work_optimizer_s"] == b["work_optimizer_s"]
    assert h["compute_s"] == pytest.approx(
        2 * (b["work_gemm_s"] + b["work_attention_s"]) + b["work_memory_bound_s"] + b["work_optimizer_s"], rel=1e-12
    )
    assert math.isclose(half["hardware"]["inter_node_gbs"], 90)


@pytest.mark.parametrize(
    "layouts, message",
    [
        ("dp_shard=abc", "'dp_shard=abc' is not NAME=INTEGER"),
        ("dp_shard=512; tp=64,dp_shard=8", "layout dp_shard=8, tp=64: num_heads=32 must be divisible by tp=64"),
        ("", "--layouts needs at least one candidate"),
    ],
)
def test_bad_layouts_exit_2(layouts, message):
    code, _, err = plan(*BASE, "--layouts", layouts)
    assert code == 2 and message in err


def test_review_figure_labels_do_not_overlap():
    """Three candidates of nearly equal step time and memory (notebook 11's review): every label's box,
    as drawn, is clear of the others' and of the legend's."""
    from hyper_parallel.cost_model import get_model
    from hyper_parallel.cost_model.hardware import get_hardware
    from hyper_parallel.cost_model.review import parse_layouts, review_layouts
    from hyper_parallel.viz.planning import review_figure

    machine = get_hardware("h100-sxm")
    text = "dp_replicate=16,dp_shard=16,cp=2,tp=8; dp_shard=512,tp=8; dp_replicate=2,dp_shard=256,tp=8"
    reviews = review_layouts(get_model("llama-8b-like"), parse_layouts(text, 4096), 8, machine)
    fig = review_figure(reviews, machine.budget_bytes)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    from matplotlib.text import Text

    labels = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text, without its leader line
    boxes = [*labels, ax.get_legend().get_window_extent(renderer)]
    assert len(boxes) == 4
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    points = ax.transData.transform([(r.step.seconds, r.cost.memory.total / 2**30) for r in reviews])
    for label in labels:  # a label covers no candidate's point (they are 7 points wide)
        assert not any(label.expanded(1, 1).padded(4).contains(x, y) for x, y in points), label


def test_design_review_example_documents_are_current():
    """docs/design_review_512.md and .html are the planner's output now (the html compared without its
    timestamp and embedded PNG); `make docs` regenerates them."""
    from pathlib import Path

    from launch.plan import review_example

    docs = Path(__file__).resolve().parents[1] / "docs"
    assert review_example.is_current(docs), "docs/design_review_512.* are not the planner's output: run make docs"


def test_the_plan_figure_keeps_every_memory_kind_visible_under_a_far_budget():
    """11's plan: about 13 GiB of memory per rank on an 80 GiB part. On an axis up to the budget the kinds
    below the activations were a few pixels high; the axis follows the bars once the budget is over twice
    them, and says the budget in words. Near the budget, the budget line is drawn."""
    from hyper_parallel.cost_model.step_time import estimate_step
    from hyper_parallel.viz.planning import budget_axis_top, plan_figure

    assert budget_axis_top(13.0, 80.0) == pytest.approx(13.0 * 1.7)
    assert budget_axis_top(60.0, 80.0) == pytest.approx(80.0 * 1.7)
    config = get_model("llama-8b-like")
    cost = estimate(config, ParallelDims(world_size=4096, dp_shard=512, tp=8))
    step = estimate_step(cost, 8, get_hardware("h100-sxm"))
    memory_axis = next(ax for ax in plan_figure(cost, step.timed, 80.0).axes if ax.get_label() == "memory")
    total = cost.memory.total / 2**30
    assert memory_axis.get_ylim()[1] == pytest.approx(total * 1.7)
    assert any("80 GiB" in text.get_text() and "above the axis" in text.get_text() for text in memory_axis.texts)
