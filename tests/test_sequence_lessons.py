"""What notebooks 04 and 09 state about the ring, 2-D sequence parallelism and the new schedules, each held
to a number derived independently (the distributed runs behind them: tests/test_cp_attention.py,
tests/test_recipes.py and tests/test_pipeline.py)."""

from __future__ import annotations

import math

import pytest

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.viz.sequence import online_softmax, ring_work, two_d_layout
from launch.notebook.exercises import EXERCISES, RIGHT, WRONG, check
from launch.notebook.sequence_lesson import online_softmax_steps, pairs_computed, two_d_holdings

TOY = [1.0, 3.0, 0.5, 2.0, -1.0, 4.0]  # notebook 04's toy row


def test_online_softmax_on_the_toy_row_by_hand():
    """Keys 0-1: m = 3, l = e^(1-3) + 1 = 1.1353; keys 2-3: m = 3, l + e^(0.5-3) + e^(2-3) = 1.5853; keys
    4-5: m = 4, l = 1.5853 e^(3-4) + e^(-5) + 1 = 1.5899. The merged probabilities are softmax."""
    steps = online_softmax_steps(TOY, block=2)
    assert [s["max"] for s in steps] == [3.0, 3.0, 4.0]
    l1 = math.exp(-2) + 1
    l2 = l1 + math.exp(-2.5) + math.exp(-1)
    l3 = l2 * math.exp(-1) + math.exp(-5) + 1
    assert [s["sum"] for s in steps] == pytest.approx([l1, l2, l3], rel=1e-12)
    assert steps[-1]["lse"] == pytest.approx(4 + math.log(l3), rel=1e-12)
    total = sum(math.exp(x) for x in TOY)
    assert steps[-1]["probabilities"] == pytest.approx([math.exp(x) / total for x in TOY], rel=1e-12)


def test_04_2_pairs_per_rank_and_its_check():
    """Zig-zag, 32 tokens, cp = 4: 3 pairs on the own block and 2 on each other, 9 on every rank;
    contiguous: rank r computes its own block and the r before it (1 pair each)."""
    assert [sum(pairs_computed(32, 4, r)) for r in range(4)] == [9] * 4
    assert [sum(pairs_computed(32, 4, r, zigzag=False)) for r in range(4)] == [1, 2, 3, 4]
    assert EXERCISES["04.2"].solution.startswith("9")
    assert check("04.2", 9, 9) == RIGHT and check("04.2", 8, 9) == WRONG


def test_04_3_and_09_2_solutions_are_the_counts_the_runs_hold():
    """04.3: backward sends (cp-2) K/V + (cp-1) dK/dV blocks per attention (tests/test_recipes.py holds
    (2cp-3) x layers against M5-R's traces): 5 at cp = 4. 09.2: 11 all-gathers per step (tests/test_pipeline.py
    holds it against P1's trace with reshard_after_forward=True)."""
    cp = 4
    assert EXERCISES["04.3"].solution.startswith(f"{(cp - 2) + (cp - 1)} ")
    assert check("04.3", 5, 5) == RIGHT and check("04.3", 3, 5) == WRONG
    assert EXERCISES["09.2"].solution.startswith("11")
    assert check("09.2", 11, 11) == RIGHT and check("09.2", 3, 11) == WRONG


def test_two_d_holdings_of_notebook_04():
    """cp 2 x ulysses 2, 16 tokens, 4 heads: ring 0 holds chunks 0 and 3 (tokens 0-3, 12-15); ulysses 0 of
    it tokens 0-3, ulysses 1 tokens 12-15; in attention both hold the ring share, heads [0, 1] and [2, 3]."""
    holdings = two_d_holdings(16, 2, 2, 4)
    assert [h["tokens"] for h in holdings] == [[0, 1, 2, 3], [12, 13, 14, 15], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert holdings[0]["attention_tokens"] == [0, 1, 2, 3, 12, 13, 14, 15]
    assert [h["attention_heads"] for h in holdings] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    dims = ParallelDims(world_size=4, cp=2, ulysses=2)
    assert [dims.coordinates(h["rank"])["ulysses"] for h in holdings] == [h["ulysses"] for h in holdings]
    assert [dims.coordinates(h["rank"])["cp"] for h in holdings] == [h["ring"] for h in holdings]


def test_04_constraints_text():
    """04's constraints: 16 tokens with cp = 4, tp = 4 would need 32 (tp*2*cp); M5-UR needs 2*cp*ulysses*tp."""
    with pytest.raises(ValueError, match=r"tp\*2\*cp = 4\*2\*4 = 32"):
        ParallelDims(world_size=16, cp=4, tp=4).check_model(seq_len=16)
    ParallelDims(world_size=8, cp=4, tp=2).check_model(seq_len=16)  # 16 = 2*2*4: fits
    with pytest.raises(ValueError, match=r"2\*cp\*ulysses\*tp = 2\*2\*2\*1 = 8"):
        ParallelDims(world_size=4, cp=2, ulysses=2).check_model(seq_len=12)


def test_figures_draw_the_numbers_they_are_given():
    """04's figures: the toy row's last probabilities on the softmax rings, one bar per (layout, rank) at
    the FLOPs given, one bar per token held (16 tokens on 4 ranks outside attention, 8 each inside)."""
    steps = online_softmax_steps(TOY, block=2)
    fig = online_softmax(TOY, steps)
    rings = next(line for line in fig.axes[1].get_lines() if line.get_label() == "softmax")
    assert list(rings.get_ydata()) == pytest.approx(steps[-1]["probabilities"], rel=1e-12)
    work = {"zig-zag": [9, 9], "contiguous": [4, 12]}
    bars = ring_work(work).axes[0].patches
    assert {layout: [b.get_height() for b in bars if b.get_gid() == layout] for layout in work} == work
    outside, inside = two_d_layout(two_d_holdings(16, 2, 2, 4), 16, 4).axes
    assert (len(outside.patches), len(inside.patches)) == (16, 4 * 8)
