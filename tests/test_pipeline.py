"""Pipeline parallelism: the bubble and activation formulas by hand, the measured bubble on a schedule
built by hand, and the session's pipeline runs (tests/conftest.py) against the formulas: the schedule
torch ran (order of forwards/backwards per rank) and the microbatches alive at once.

No launch of its own: the runs are the recipe matrix's (P1, P1-G, P1-I, P2), checked against the
reference and the hand-derived collectives in tests/test_recipes.py.
"""

from __future__ import annotations

import pytest
from conftest import result_of

from hyper_parallel import ParallelDims, viz
from hyper_parallel.cost_model.pipeline import alive_microbatches, bubble_fraction, p2p_bytes
from hyper_parallel.recipes import RECIPES
from launch.notebook.tables import gathered_per_step


def test_bubble_fraction_by_hand():
    """(p-1)/(m+p-1): p=2, m=2 -> 1/3; p=2, m=4 -> 1/5; p=4, m=4 -> 3/7. Interleaved v=2 stages per rank:
    (p-1)/(v m + p-1): p=2, m=4 -> 1/9."""
    assert bubble_fraction("gpipe", 2, 2) == pytest.approx(1 / 3)
    assert bubble_fraction("1f1b", 2, 4) == pytest.approx(1 / 5)
    assert bubble_fraction("gpipe", 4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction("interleaved_1f1b", 2, 4, stages_per_rank=2) == pytest.approx(1 / 9)
    # zero bubble, two stages per rank in a V: b/(m+b) idle slots, b = (p-1)/6 (ZB-V) or (p-1)/3 (DualPipeV);
    # p=2, m=4 -> (1/6)/(25/6) = 1/25 = 4% and (1/3)/(13/3) = 1/13 = 8%, the "few percent" of notebook 09
    assert bubble_fraction("zbv", 2, 4, stages_per_rank=2) == pytest.approx(1 / 25)
    assert bubble_fraction("dualpipev", 2, 4, stages_per_rank=2) == pytest.approx(1 / 13)
    assert bubble_fraction("dualpipev", 4, 8, stages_per_rank=2) == pytest.approx(1 / 9)
    with pytest.raises(ValueError, match="only interleaved_1f1b runs several stages per rank"):
        bubble_fraction("1f1b", 2, 4, stages_per_rank=2)
    with pytest.raises(ValueError, match="unknown schedule 'zb'"):
        bubble_fraction("zb", 2, 4)


def test_p2p_bytes_by_hand():
    """pp=2, 4 microbatches of a 2048-B message: stage 0 sends 8192 B forward, receives 8192 B backward;
    stage 1 the reverse. Interleaved (stages 0, 2 on rank 0; 1, 3 on rank 1): rank 0 sends forward from
    both stages (16384 B) and backward only from stage 2 (8192 B)."""
    assert p2p_bytes(2, 0, 4, 2048) == {
        ("send", "forward"): 8192,
        ("recv", "forward"): 0,
        ("send", "backward"): 0,
        ("recv", "backward"): 8192,
    }
    assert p2p_bytes(2, 1, 4, 2048) == {
        ("send", "forward"): 0,
        ("recv", "forward"): 8192,
        ("send", "backward"): 8192,
        ("recv", "backward"): 0,
    }
    assert p2p_bytes(2, 0, 4, 2048, stages_per_rank=2) == {
        ("send", "forward"): 16384,
        ("recv", "forward"): 8192,
        ("send", "backward"): 8192,
        ("recv", "backward"): 16384,
    }


def test_plan_lines_at_8192_ranks_by_hand():
    """llama-8b-like (32 layers, d_model 4096, seq 8192, global batch 512, bf16 activations) on 8192 ranks,
    tp=8, pp=4: dp = 8192 / 32 = 256, 2 rows per rank. One microbatch of 2 rows: the boundary tensor, sharded
    by tp under sequence parallelism, is 2 x 8192 / 8 x 4096 x 2 B = 16 MiB; a middle stage sends and
    receives it once each way: 64 MiB; the
    bubble (4-1)/(1+4-1) = 75% and a warning. --micro-batch 1: m=2, bubble 3/5 = 60%, stage 0 of 1F1B
    holds min(2, 4) = 2 microbatches, and still fewer microbatches than stages: the warning stays."""
    from hyper_parallel import ParallelDims
    from hyper_parallel.cost_model import get_model
    from hyper_parallel.cost_model.pipeline import plan_lines

    dims = ParallelDims(world_size=8192, tp=8, pp=4)
    text = "\n".join(plan_lines(get_model("llama-8b-like"), dims))
    assert "pp=4 stages of 8 layers, 1 microbatch(es) of 2 rows" in text
    assert "WARNING: 1 microbatch(es) < pp=4" in text and "bubble (p-1)/(m+p-1) = 75%" in text
    assert "64.0 MiB sent + received (16.00 MiB per microbatch each way)" in text
    text = "\n".join(plan_lines(get_model("llama-8b-like").replace(micro_batch=1), dims))
    assert (
        "WARNING: 2 microbatch(es) < pp=4" in text
        and "gpipe  bubble (p-1)/(m+p-1) = 60%; stage 0 holds 2 microbatch" in text
    )
    assert "1f1b   bubble (p-1)/(m+p-1) = 60%; stage 0 holds 2 microbatch" in text


def _synthetic_gpipe() -> dict[int, list[dict]]:
    """GPipe, p=2, m=2, every forward and backward 1 s: rank 0 F0 [0,1] F1 [1,2] B0 [4,5] B1 [5,6];
    rank 1 F0 [1,2] F1 [2,3] B0 [3,4] B1 [4,5]. Span 6 s, each rank busy 4 s: idle 1/3 = the formula."""

    def action(kind, mb, start, stage):
        return {
            "kind": "pipeline",
            "action": kind,
            "phase": kind,
            "stage": stage,
            "microbatch": mb,
            "step": 1,
            "t_start": float(start),
            "t_end": float(start + 1),
        }

    return {
        0: [
            action("forward", 0, 0, 0),
            action("forward", 1, 1, 0),
            action("backward", 0, 4, 0),
            action("backward", 1, 5, 0),
        ],
        1: [
            action("forward", 0, 1, 1),
            action("forward", 1, 2, 1),
            action("backward", 0, 3, 1),
            action("backward", 1, 4, 1),
        ],
    }


def test_measured_bubble_of_an_ideal_schedule_is_the_formula():
    traces = _synthetic_gpipe()
    assert viz.measured_bubble(traces, 1) == pytest.approx({0: 1 / 3, 1: 1 / 3})
    fig = viz.pipeline_schedule(traces, step=1, schedule="gpipe")
    ax = fig.axes[0]
    assert len(ax.patches) == 8  # one bar per action
    assert sorted(t.get_text() for t in ax.texts if t.get_text().isdigit()) == ["0", "0", "0", "0", "1", "1", "1", "1"]
    assert "measured bubble 33%" in ax.get_title() and "1/3 = 33%" in ax.get_title()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stage 0 · rank 0", "stage 1 · rank 1"]
    with pytest.raises(ValueError, match="no pipeline actions in step 2"):
        viz.pipeline_schedule(traces, step=2)


def _order(events: list[dict]) -> list[str]:
    return [
        f"{e['action'][0].upper()}{e['microbatch']}"
        for e in sorted(
            (e for e in events if e.get("kind") == "pipeline" and e["step"] == 1), key=lambda e: e["t_start"]
        )
    ]


def _peak_alive(order: list[str]) -> int:
    alive = peak = 0
    for action in order:
        alive += 1 if action[0] == "F" else -1
        peak = max(peak, alive)
    return peak


@pytest.mark.distributed
@pytest.mark.parametrize("recipe, schedule", [("P1", "1f1b"), ("P1-G", "gpipe")])
def test_runs_follow_the_schedule_and_its_activation_bound(recipe, schedule, recipe_results):
    """The order each rank ran (pp=2, m=4), by hand: GPipe F0 F1 F2 F3 B0 B1 B2 B3 on both stages;
    1F1B stage 0 F0 F1 B0 F2 B1 F3 B2 B3 (warm-up of p - s = 2 forwards), stage 1 F0 B0 F1 B1 F2 B2 F3 B3.
    The microbatches alive at once (forwarded, not yet backwarded) equal cost_model's
    alive_microbatches: GPipe 4 on both stages, 1F1B 2 on stage 0 and 1 on stage 1."""
    degrees = RECIPES[recipe].default
    result = result_of(recipe, degrees, recipe_results)
    assert result.ok, result.error
    expected = {
        "gpipe": ["F0 F1 F2 F3 B0 B1 B2 B3"] * 2,
        "1f1b": ["F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"],
    }[schedule]
    for rank, events in result.traces.items():
        stage = rank // (degrees["world_size"] // degrees["pp"])
        order = _order(events)
        assert " ".join(order) == expected[stage], rank
        assert _peak_alive(order) == alive_microbatches(schedule, degrees["pp"], 4, stage)
    fig = viz.pipeline_schedule(result.traces, step=1, schedule=schedule)
    assert len(fig.axes[0].patches) == 8 * degrees["world_size"]  # m forwards + m backwards per rank
    bubble = viz.measured_bubble(result.traces, 1)
    assert all(0.0 < b < 1.0 for b in bubble.values())  # every rank waited some of the step (the fill)


@pytest.mark.distributed
def test_the_three_schedules_give_the_same_losses(recipe_results):
    """GPipe, 1F1B and interleaved 1F1B run the same microbatches through the same weights, only in
    another order: on P1's mesh their losses agree to float32 rounding (each also equals the reference,
    tests/test_recipes.py). The schedules' variants run on one mesh only, to keep the suite short."""
    degrees = RECIPES["P1"].default
    results = [result_of(name, degrees, recipe_results) for name in ("P1", "P1-G", "P1-I")]
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.metrics["notes"]["schedule"] for r in results] == ["1f1b", "gpipe", "interleaved_1f1b"]
    for other in results[1:]:
        assert other.metrics["losses"] == pytest.approx(results[0].metrics["losses"], rel=1e-5)


@pytest.mark.distributed
def test_fsdp_reduces_once_per_step_not_per_microbatch(recipe_results):
    """torch's schedules turn gradient sync off for every microbatch's backward and reduce once at the end of
    the step, for any FSDPModule (ours is one). P1: 4 layers on pp=2 stages, each stage's 2 layers and the
    stage root are fully_shard units over dp_shard=2, so every rank reduce-scatters 3 times per step, not
    3 x 4 microbatches = 12 (what ours did while torch did not recognise it)."""
    result = result_of("P1", RECIPES["P1"].default, recipe_results)
    assert result.ok, result.error
    for rank, events in result.traces.items():
        per_step = {}
        for event in events:
            if event.get("kind") == "collective" and event["op"] == "reduce_scatter":
                per_step[event["step"]] = per_step.get(event["step"], 0) + 1
        assert per_step and set(per_step.values()) == {3}, (rank, per_step)


LAYER_BYTES = 4 * (4 * 32 * 32 + 2 * 32 * 64 + 2 * 32)
"""One layer's parameters, float32: wq, wk, wv, wo (d x d, d = 32), w1 and w2 (d x hidden, hidden = 64), two
norms (d): 33,024 B. The embedding and the head are vocab x d = 64 x 32: 8,192 B each; the final norm 128 B."""
STAGE_BYTES = {0: 8192 + 2 * LAYER_BYTES, 1: 2 * LAYER_BYTES + 128 + 8192}  # P1's stages: 74,240 and 74,368 B


@pytest.mark.distributed
@pytest.mark.parametrize("recipe", ["P1", "P1-G"])
def test_every_unit_stays_gathered_from_its_first_forward(recipe, recipe_results):
    """No unit reshards after forward under PP (torchtitan's default): from the end of a stage's first
    forward to the end of its last backward, every action leaves all of the stage's parameters gathered,
    measured after each action (the trace's ``gathered_bytes``), against their sizes by hand. The peak is
    what torch's schedule keeps anyway once backward starts (no reshard after backward until the step ends),
    so resharding after forward would save memory only during the warm-up."""
    degrees = RECIPES[recipe].default
    result = result_of(recipe, degrees, recipe_results)
    assert result.ok, result.error
    for rank, events in result.traces.items():
        stage = rank // (degrees["world_size"] // degrees["pp"])
        held = [e["gathered_bytes"] for e in events if e.get("kind") == "pipeline" and e["step"] == 1]
        assert held == [STAGE_BYTES[stage]] * 8, (rank, held)


ROOT_BYTES = {0: 8192, 1: 128 + 8192}  # what a stage's root holds: the embedding; the final norm and the head


@pytest.mark.distributed
def test_resharding_after_forward_under_pp_gathers_per_microbatch_for_the_same_peak(recipe_results):
    """P1 (1F1B, pp 2 x dp_shard 2, 4 microbatches) with every layer resharded after forward
    (``reshard_after_forward=True``; notebook 09's ``gathered_per_step`` reads the same): rank 0 issues 11 all-gathers per step, 5 in forward and 6 in
    backward (tests/test_recipes.py derives them from the order), where the default issues 3 (one per
    unit); both equal the reference. Measured memory after each action: a layer is freed after each
    forward, but torch's schedule keeps it after backward, so stage 0 (F0 F1 B0 F2 B1 F3 B2 B3) holds its
    root alone (8,192 B) after every forward and the whole stage (74,240 B) after every backward, and
    stage 1 (F0 B0 F1 B1 ...) alternates 8,320 and 74,368 B: the same peak as the default."""
    from test_recipes import expected_pipeline_collectives, step_collectives

    degrees = RECIPES["P1"].default
    default = result_of("P1", degrees, recipe_results)
    resharded = result_of("P1", {**degrees, "reshard_after_forward": True}, recipe_results)
    assert default.ok and resharded.ok, (default.error, resharded.error)
    dims = ParallelDims(**degrees)
    gathers = {
        name: sum(n for (op, _, _), n in step_collectives(result).items() if op == "all_gather")
        for name, result in (("default", default), ("resharded", resharded))
    }
    assert gathers == {"default": 3, "resharded": 11}
    assert step_collectives(resharded) == expected_pipeline_collectives("1f1b", False, dims, reshard_after_forward=True)
    for rank, events in resharded.traces.items():
        stage = rank // (degrees["world_size"] // degrees["pp"])
        actions = [e for e in events if e.get("kind") == "pipeline" and e["step"] == 1]
        held = [STAGE_BYTES[stage] if e["action"] == "backward" else ROOT_BYTES[stage] for e in actions]
        assert [e["gathered_bytes"] for e in actions] == held, rank
        assert max(held) == max(e["gathered_bytes"] for e in default.traces[rank] if e.get("kind") == "pipeline")
    assert [gathered_per_step(result) for result in (default, resharded)] == [
        {"all_gathers": 3, "after_first_action": STAGE_BYTES[0], "peak": STAGE_BYTES[0]},
        {"all_gathers": 11, "after_first_action": ROOT_BYTES[0], "peak": STAGE_BYTES[0]},
    ]
