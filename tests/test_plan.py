"""`python -m launch plan`: layouts of thousands of ranks checked on DeviceMeshes of torch's fake process
group, against rank lists and node placements derived by hand from the mesh order; invalid input;
``--compare`` against the cost model's own numbers; the torchrun command against ``launch command``."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hyper_parallel import ParallelDims, valid_choices
from hyper_parallel.cost_model import estimate, get_model
from hyper_parallel.cost_model.hardware import get_hardware
from hyper_parallel.cost_model.layouts import nodes_spanned, timed_collectives
from hyper_parallel.cost_model.step_time import estimate_step
from launch import cli

ROOT = Path(__file__).resolve().parents[1]
LAYOUT_4096 = ["--world", "4096", "--dp-replicate", "8", "--dp-shard", "16", "--cp", "2", "--tp", "16"]


def rank_of(dp_replicate: int, dp_shard: int, cp: int, tp: int) -> int:
    """Dense view (dp_replicate 8, dp_shard 16, cp 2, tp 16), tp fastest: the mixed-radix rank."""
    return ((dp_replicate * 16 + dp_shard) * 2 + cp) * 16 + tp


def plan(*args: str) -> tuple[int, dict | str, str]:
    """``python -m launch plan ARGS --json`` in this process: exit code, the JSON document (or stdout), stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["plan", *args])
    text = out.getvalue()
    return code, json.loads(text) if "--json" in args and code == 0 else text, err.getvalue()


def test_4096_ranks_with_hand_derived_rank_lists():
    """No worker starts: the groups of 4096 ranks come from DeviceMeshes on torch's fake process group."""
    done = subprocess.run(
        [sys.executable, "-m", "launch", "plan", *LAYOUT_4096, "--model", "llama-8b-like", "--rank", "1000", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    groups = json.loads(done.stdout)["plan"]["groups"]
    assert rank_of(1, 15, 0, 8) == 1000
    # tp: the 16 ranks that differ from 1000 only in the tp coordinate; dp_shard: only in dp_shard
    assert groups["tp"]["rank_group"] == [rank_of(1, 15, 0, t) for t in range(16)] == list(range(992, 1008))
    assert groups["dp_shard"]["rank_group"] == [rank_of(1, s, 0, 8) for s in range(16)]
    assert groups["dp_shard"]["rank_group"][:3] == [520, 552, 584]
    assert groups["tp"]["first_groups"][0] == list(range(16))
    assert groups["dp_shard"]["first_groups"] == [
        [rank_of(0, s, 0, 0) for s in range(16)],
        [rank_of(0, s, 0, 1) for s in range(16)],
    ]
    # fsdp = dp_shard x cp flattened: every (dp_shard, cp) pair, dp_shard outer
    assert groups["fsdp"]["rank_group"] == [rank_of(1, s, c, 8) for s in range(16) for c in range(2)]
    assert {dim: (g["size"], g["count"]) for dim, g in groups.items()} == {
        "dp_replicate": (8, 512),
        "dp_shard": (16, 256),
        "cp": (2, 2048),
        "tp": (16, 256),
        "fsdp": (32, 128),
        "dp": (128, 32),
        "dp_cp": (256, 16),
    }


@pytest.mark.parametrize("gpus_per_node", [8, 16, 32])
def test_groups_crossing_node_boundaries(gpus_per_node):
    code, doc, err = plan(
        *LAYOUT_4096, "--model", "llama-8b-like", "--rank", "1000", "--gpus-per-node", str(gpus_per_node), "--json"
    )
    assert code == 0, err
    groups = doc["plan"]["groups"]
    hand = {
        "tp": [rank_of(1, 15, 0, t) for t in range(16)],
        "cp": [rank_of(1, 15, c, 8) for c in range(2)],
        "dp_shard": [rank_of(1, s, 0, 8) for s in range(16)],
        "dp_replicate": [rank_of(r, 15, 0, 8) for r in range(8)],
    }
    for dim, ranks in hand.items():
        nodes = len({rank // gpus_per_node for rank in ranks})  # node n holds ranks [n*G, (n+1)*G)
        assert groups[dim]["rank_group"] == ranks
        assert groups[dim]["nodes_spanned"] == nodes, dim  # all groups of a dim span alike here
    expected_nodes = {8: {"tp": 2, "cp": 2}, 16: {"tp": 1, "cp": 2}, 32: {"tp": 1, "cp": 1}}[gpus_per_node]
    assert {dim: groups[dim]["nodes_spanned"] for dim in ("tp", "cp")} == expected_nodes
    assert groups["dp_shard"]["nodes_spanned"] == 16 and groups["dp_replicate"]["nodes_spanned"] == 8
    dims = ParallelDims(world_size=4096, dp_replicate=8, dp_shard=16, cp=2, tp=16)
    for dim, g in groups.items():  # the DeviceMeshes' groups and the cost model's arithmetic agree
        assert g["nodes_spanned"] == nodes_spanned(dims, dim, gpus_per_node), dim
    crossing = {(c["op"], c["group"]): c["crosses_nodes"] for c in doc["plan"]["communication"]}
    assert crossing[("all_gather", "tp")] == (gpus_per_node < 16)
    assert crossing[("all_gather", "cp")] == (gpus_per_node < 32) and crossing[("all_gather", "fsdp")]


def test_8192_ranks():
    args = ["--world", "8192", "--dp-replicate", "8", "--dp-shard", "32", "--cp", "2", "--tp", "16"]
    code, doc, err = plan(*args, "--model", "llama-8b-like", "--rank", "8191", "--json")
    assert code == 0, err
    groups = doc["plan"]["groups"]
    assert groups["tp"]["rank_group"] == list(range(8176, 8192))
    assert groups["dp_replicate"]["rank_group"] == [1023 + 1024 * r for r in range(8)]
    assert doc["plan"]["command"].splitlines()[-1].startswith("torchrun --nnodes=1024 --nproc-per-node=8")


@pytest.mark.parametrize(
    "degrees",
    [
        ["--world", "8", "--dp-replicate", "2", "--dp-shard", "2"],  # world-size equation
        ["--world", "8", "--dp-shard", "4", "--tp", "2", "--ep", "2", "--etp", "4"],  # illegal etp
        ["--world", "8", "--tp", "4", "--ep", "2"],  # ep does not fit
    ],
)
def test_invalid_degrees_exit_2_with_the_message_of_launch_check(degrees, capsys):
    """Degrees that divide the world but break a mesh rule: plan says what launch check says. (A degree
    that does not divide the world gets plan's own message, the nearest divisor: tests/test_plan_refusals.py.)"""
    assert cli.main(["check", *degrees]) == 2
    check_error = capsys.readouterr().err
    code, _, err = plan(*degrees, "--model", "small")
    assert code == 2 and err == check_error and err.startswith("error: ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--world", "64", "--tp", "64", "--model", "llama-8b-like"], "num_heads=32 must be divisible by tp=64"),
        (["--world", "16", "--cp", "4", "--tp", "4", "--model", "small"], "seq_len=16 must be divisible by tp*2*cp"),
        (
            ["--world", "64", "--dp-shard", "64", "--ep", "32", "--model", "moe-16e"],
            "num_experts=16 must be divisible by ep=32",
        ),
        (
            ["--world", "4096", "--gpus-per-node", "12", "--model", "llama-8b-like"],
            "gpus_per_node=12 must be >= 1 and divide world_size=4096",
        ),
    ],
)
def test_invalid_for_the_model_exits_2(args, message):
    code, _, err = plan(*args)
    assert code == 2 and message in err


@pytest.mark.parametrize("sort", ["time", "memory"])
def test_compare_ranks_layouts_by_the_models_own_numbers(sort):
    code, doc, err = plan(
        "--world",
        "64",
        "--tp",
        "8",
        "--model",
        "llama-8b-like",
        "--compare",
        "--sort",
        sort,
        "--top",
        "6",
        "--memory-gib",
        "40",
        "--json",
    )
    assert code == 0, err
    shown = doc["compare"]
    config = get_model("llama-8b-like")
    hardware = get_hardware("h100-nvl8-ndr")
    expected = []  # every dense layout of 64 ranks (pp too, with micro-batches of one row) costed here
    for dims in valid_choices(64, {"ep": 1, "etp": 1}, pipeline=True):
        try:
            cost = estimate(config.replace(micro_batch=1) if dims.pp > 1 else config, dims)
        except ValueError:
            continue
        seconds = estimate_step(cost, 8, hardware).seconds
        serial = sum(c.seconds for c in timed_collectives(cost, 8, hardware.bandwidth))
        fits = cost.memory.total <= (40 - 8) * 1024**3  # --memory-gib 40 minus the 8 GiB reserve
        key = (not fits, seconds, cost.memory.total) if sort == "time" else (not fits, cost.memory.total, seconds)
        expected.append((key, dims.degrees(), cost.memory.total, seconds, fits, serial))
    expected.sort(key=lambda row: row[0])
    assert doc["compare_total"] == len(expected) > 6
    assert [(r["degrees"], r["memory_bytes"], r["fits"]) for r in shown] == [e[1:3] + (e[4],) for e in expected[:6]]
    assert [r["step_seconds"] for r in shown] == pytest.approx([e[3] for e in expected[:6]], rel=1e-12)
    assert [r["comm_seconds"] for r in shown] == pytest.approx([e[5] for e in expected[:6]], rel=1e-12)
    assert any(not e[4] for e in expected), "the memory budget should rule some layouts out"
    assert any(e[1]["pp"] > 1 for e in expected), "--compare takes pp"


def test_text_header_reflects_the_overrides():
    """--batch 2048 --seq-len 4096 on llama-8b-like (preset: seq_len 8192, global batch 512): the text header
    says what the JSON says."""
    args = ["--world", "512", "--dp-shard", "512", "--model", "llama-8b-like", "--batch", "2048", "--seq-len", "4096"]
    code, text, err = plan(*args, "--ac", "full", "--micro-batch", "2")
    assert code == 0, err
    header = text.splitlines()[1]
    assert "seq_len 4096, global batch 2048" in header and "8192" not in header and " 512" not in header
    assert "micro-batch 2" in header and "AC full" in header
    code, doc, err = plan(*args, "--json")
    assert (doc["plan"]["seq_len"], doc["plan"]["global_batch"]) == (4096, 2048)


def _without_ids(command: str) -> str:
    """A torchrun line with its per-launch random suffixes (--rdzv-id, the run directory) masked."""
    return re.sub(r"-[0-9a-f]{8}\b", "-<id>", command)


def test_text_output_and_the_command_of_launch_command():
    layout = ["--world", "16", "--dp-replicate", "2", "--dp-shard", "2", "--cp", "2", "--tp", "2"]
    code, text, err = plan(*layout, "--model", "small", "--gpus-per-node", "8", "--compare")
    assert code == 0, err
    assert "groups crossing node boundaries with 8 GPUs per node: dp_replicate, dp, dp_cp" in text
    assert "time per collective: ring collectives" in text and (
        "<- this plan" in text or "this plan's layout is #" in text
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["command", "C", *layout, "--nnodes", "2", "--nproc-per-node", "8"]) == 0
    # the same torchrun line (recipe C trains the small model), up to the fresh rendezvous id; launch command
    # may add its own --out after it
    line = next(x for x in _without_ids(text).splitlines() if x.startswith("torchrun"))
    assert next(x for x in _without_ids(out.getvalue()).splitlines() if x.startswith("torchrun")).startswith(line)


def test_plan_widget_offers_only_valid_values_and_explains_invalid_ones():
    from launch.notebook.widgets.plan_widget import PlanWidget
    from launch.plan.build import torchrun_command

    widget = PlanWidget("llama-8b-like", world_size=64, tp=8)  # dp_shard inferred: 8
    assert widget.error is None and widget.degrees["dp_shard"] == 8
    offered = {name: [value for _, value in selector.options] for name, selector in widget.selectors.items()}
    # 32 heads: tp up to 32; a dense model: no experts; every power of two of 64 ranks for the data dims
    assert offered["tp"] == [1, 2, 4, 8, 16, 32] and offered["ep"] == [1] and offered["etp"] == [1]
    assert offered["dp_shard"] == [1, 2, 4, 8, 16, 32, 64]
    assert {label for label, _ in widget.selectors["tp"].options} == {"1", "2", "4", "8", "16", "32"}
    widget.set(tp=64, dp_shard=1)
    assert widget.error.startswith("num_heads=32 must be divisible by tp=64") and widget.cost is None
    assert dict(widget.selectors["tp"].options)["64 (no valid layout)"] == 64
    # nearest valid: no single change fixes it; of the two-degree changes keeping TP on, the smallest in
    # factors of two halve tp and double one data dim (tp=32 with dp_shard, dp_replicate or cp = 2); the
    # enumeration (dp_replicate, then cp, outermost) meets dp_shard=2 first
    widget.fix_button.click()
    expected = ParallelDims(world_size=64, dp_shard=2, tp=32)
    assert widget.error is None and widget.dims == expected
    assert widget.cost == estimate(get_model("llama-8b-like"), expected)
    assert widget.step.seconds == estimate_step(widget.cost, 8, get_hardware("h100-nvl8-ndr")).seconds
    assert f"MFU {widget.step.middle.mfu:.0%}" in widget.status.value
    assert _without_ids(widget.command) == _without_ids(
        torchrun_command(widget.config, widget.dims, 8, "$MASTER_ADDR:29500")
    )
    assert {ax.get_label() for ax in widget.figure.axes} == {"memory", "communication"}
    widget.set(world_size=128)  # a new world: the nearest valid layout of 128 ranks
    assert widget.error is None and widget.dims.world_size == 128
