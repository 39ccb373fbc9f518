"""The concept figures and idealized steps of hyper_parallel.viz.concepts (torch-free, no workers).

The idealized schedule is an independent derivation (unit by unit, layer by layer, written from what
each style does) of the collectives the cost model counts from its formulas: for every recipe below
the two must agree on every (op, group, phase) count. The runs' traces equal the cost model
(tests/test_cost_model.py), so the picture a learner sees first is the one the run measures.
"""

from __future__ import annotations

import pytest

from hyper_parallel.cost_model import estimate, recipe_model
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.viz import concept_figure, cp_chunks, ideal_schedule, ideal_timeline
from hyper_parallel.viz.concepts import STYLES
from hyper_parallel.viz.ideal_step import schedule_counts

RECIPES = {  # recipe: (its default degrees, the schedule's flags for it)
    "M1": (dict(world_size=2, dp_shard=2), dict(model="mlp", shard=False, replicate=True)),
    "M4": (dict(world_size=2, dp_shard=2), dict(model="mlp")),
    "M7": (dict(world_size=4, dp_replicate=2, dp_shard=2), dict(replicate=True)),
    "M2": (dict(world_size=2, tp=2), dict(tp=True, shard=False)),
    "M3": (dict(world_size=2, tp=2), dict(tp=True, sp=True, shard=False)),
    "M5": (dict(world_size=2, cp=2), dict(cp=True)),
    "S1": (dict(world_size=4, dp_shard=4, ep=2), dict(moe_layers=(1,))),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_ideal_schedule_counts_equal_the_cost_model(recipe):
    degrees, flags = RECIPES[recipe]
    expected = estimate(recipe_model(recipe), ParallelDims(**degrees)).counts()
    assert dict(schedule_counts(ideal_schedule(2, **flags))) == dict(expected)


def test_ideal_schedule_of_fsdp_by_hand():
    """MLP with 2 blocks + root under FSDP: forward AG root, AG block 0, AG block 1 (3); backward the
    blocks again (2, the root keeps its parameters) and one RS per unit (3)."""
    slots = [(s.phase, s.op) for s in ideal_schedule(2, model="mlp") if s.op]
    assert slots == [("forward", "all_gather")] * 3 + [
        ("backward", "all_gather"),
        ("backward", "reduce_scatter"),
    ] * 2 + [("backward", "reduce_scatter")]


def test_ideal_schedule_rejects_sp_without_tp():
    with pytest.raises(ValueError, match="needs tp"):
        ideal_schedule(2, sp=True)


def test_cp_chunks_balance_the_causal_mask():
    """Chunk k of 2cp attends over k+1 key chunks; ranks holding i and 2cp-1-i all get 2cp+1 blocks
    (cp=2: rank 0 chunks 0 and 3 -> 1+4, rank 1 chunks 1 and 2 -> 2+3)."""
    assert cp_chunks(2) == {0: (0, 3), 1: (1, 2)}
    for cp in (1, 2, 3, 4):
        chunks = cp_chunks(cp)
        assert sorted(c for pair in chunks.values() for c in pair) == list(range(2 * cp))
        assert {sum(c + 1 for c in pair) for pair in chunks.values()} == {2 * cp + 1}
    with pytest.raises(ValueError):
        cp_chunks(0)


def test_concept_figure_cp_colours_the_unmasked_blocks_by_rank():
    fig = concept_figure("cp")
    split = next(ax for ax in fig.axes if ax.get_label() == "concept:split")
    owners = [p.get_gid() for p in split.patches if (p.get_gid() or "").startswith("owner")]
    assert owners.count("owner0") == 5 and owners.count("owner1") == 5  # 10 of 16 blocks under the mask


@pytest.mark.parametrize("style", STYLES)
def test_concept_figure_flow_is_one_layer_of_the_schedule(style):
    fig = concept_figure(style)
    flow = next(ax for ax in fig.axes if ax.get_label() == "concept:flow")
    drawn = [p.get_gid().removeprefix("flow:") for p in flow.patches if (p.get_gid() or "").startswith("flow:")]
    assert "compute" in drawn and len(drawn) > 2
    expected_ops = {
        "ddp": {"all_reduce"},
        "fsdp": {"all_gather", "reduce_scatter"},
        "hsdp": {"all_gather", "reduce_scatter", "all_reduce"},
        "tp": {"all_reduce"},
        "sp": {"all_gather", "reduce_scatter", "all_reduce"},
        "cp": {"all_gather", "reduce_scatter"},
        "moe": {"all_to_all"},
    }[style]
    assert set(drawn) - {"compute"} == expected_ops


def test_concept_figure_rejects_an_unknown_style():
    with pytest.raises(ValueError, match="choose one of"):
        concept_figure("pp")


def test_ideal_timeline_draws_every_slot():
    schedule = ideal_schedule(2, tp=True, sp=True, shard=False)
    fig = ideal_timeline(schedule, "M3")
    [ax] = fig.axes
    bars = [p.get_gid() for p in ax.patches if (p.get_gid() or "").startswith("ideal:")]
    assert len(bars) == len(schedule)
    assert bars.count("ideal:all_gather") == 11 and bars.count("ideal:reduce_scatter") == 10
    assert "11 AG, 3 AR, 10 RS" in ax.get_title()
    with pytest.raises(ValueError):
        ideal_timeline([])


def test_cp_chunks_are_the_layout_the_cp_attention_uses():
    """The schematic's chunks are the positions the run's CP attention gives each cp rank."""
    from hyper_parallel.parallel.sequence_layout import load_balanced_positions

    for cp in (1, 2, 4):
        size = 16 // (2 * cp)
        for rank, chunks in cp_chunks(cp).items():
            held = sorted({int(p) // size for p in load_balanced_positions(16, cp, rank)})
            assert held == sorted(set(chunks)), (cp, rank, held)


def test_every_idealized_bar_label_fits_inside_its_bar():
    """01's and 05's idealized timelines clipped "AR dp_replicate+fsdp" to "AR dp_replicate+fsd": every
    label inside a bar is drawn no taller than that bar (rendered extents)."""
    from hyper_parallel.viz import ideal_schedule, ideal_timeline

    for schedule in (ideal_schedule(2, model="mlp", shard=False, replicate=True), ideal_schedule(2, replicate=True)):
        fig = ideal_timeline(schedule)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        bars = [p for p in ax.patches if (p.get_gid() or "").startswith("ideal:")]
        labels = [t for t in ax.texts if t.get_rotation() == 90]
        assert len(bars) == len(labels) == len(schedule)
        for bar, label in zip(bars, labels):
            assert label.get_window_extent(renderer).height <= bar.get_window_extent(renderer).height, label.get_text()


def test_concept_figures_name_only_what_they_draw_and_explain_the_copies():
    """00's and 01's FSDP figure named AR and A2A, which it does not draw, drew copies as grey cells with
    rank strips without a word, and left half its flow panel empty."""
    from hyper_parallel.viz import concept_figure

    for style, named, unnamed in (("fsdp", {"AG", "RS"}, {"AR", "A2A"}), ("tp", {"AR"}, {"AG", "RS", "A2A"})):
        fig = concept_figure(style)
        flow = next(ax for ax in fig.axes if ax.get_label() == "concept:flow")
        title = " ".join(flow.get_title().split())
        assert all(f"{op} " in title for op in named) and not any(f"{op} " in title for op in unnamed), title
        boxes = [p for p in flow.patches if (p.get_gid() or "").startswith("flow:")]
        assert flow.get_xlim()[1] == max(3, max(p.get_x() for p in boxes) + 1)  # no empty columns to the right
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert ("a copy on each rank striped in it" in legend) == (style == "fsdp"), legend
