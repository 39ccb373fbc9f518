"""The alpha-beta model of notebook 00b: the fit recovers known alpha and beta, the ring identity holds in
steps and bytes, ring and tree cross where the formula says, the planner's links are its presets, and the
notebook's exercises, tables and sentences say what the model computes. One distributed test times the
collectives on the warm pool (2 ranks, two sizes) and checks the identity's results bit for bit."""

from __future__ import annotations

import math
import random
import re

import nbformat
import pytest

from hyper_parallel.cost_model.alpha_beta import (
    COLLECTIVES,
    LINKS,
    Sample,
    cheaper_algorithm,
    fit,
    hops,
    predict_seconds,
    ring_tree_crossover_bytes,
    wire,
)
from hyper_parallel.cost_model.communication import wire_factor
from hyper_parallel.cost_model.hardware import HARDWARE
from hyper_parallel.viz.style import fmt_bytes
from launch.notebook.exercises import EXERCISES, RIGHT, UNANSWERED, WRONG, check, check_within
from launch.notebook.workbook import NOTEBOOKS_DIR

SIZES = [1 << k for k in range(10, 21, 2)]


def _synthetic(alpha: float, beta: float, noise: float = 0.0, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    return [
        Sample(op, n, size, predict_seconds(op, n, size, alpha, beta) * (1 + rng.uniform(-noise, noise)))
        for op in COLLECTIVES
        for n in (2, 4)
        for size in SIZES
    ]


def test_the_fit_recovers_alpha_and_beta_from_exact_times():
    fits = fit(_synthetic(150e-6, 1.2e9))
    assert list(fits) == list(COLLECTIVES)
    for f in fits.values():
        assert f.alpha == pytest.approx(150e-6, rel=1e-9) and f.beta == pytest.approx(1.2e9, rel=1e-9)
        assert f.samples == 12 and f.rms_relative_error < 1e-9


def test_the_fit_is_close_on_noisy_times_and_weighs_every_size_alike():
    """10 % noise on every time: alpha and beta within 15 %. Scaling every time by 1000 scales alpha by 1000
    and beta by 1/1000 exactly: the fit minimises relative errors, so no size dominates it."""
    noisy = _synthetic(200e-6, 0.8e9, noise=0.10, seed=3)
    fits = fit(noisy)
    for f in fits.values():
        assert f.alpha == pytest.approx(200e-6, rel=0.15) and f.beta == pytest.approx(0.8e9, rel=0.15)
    scaled = fit([Sample(s.op, s.n, s.nbytes, s.seconds * 1000) for s in noisy])
    for op, f in fits.items():
        assert scaled[op].alpha == pytest.approx(f.alpha * 1000, rel=1e-9)
        assert scaled[op].beta == pytest.approx(f.beta / 1000, rel=1e-9)


def test_the_fit_keeps_alpha_and_beta_non_negative_and_refuses_one_size():
    flat = [Sample("all_gather", 2, size, 1e-3) for size in SIZES]  # latency only: no bandwidth term left
    f = fit(flat)["all_gather"]
    assert f.alpha == pytest.approx(1e-3) and math.isinf(f.beta)
    with pytest.raises(ValueError, match="at least two sizes"):
        fit([Sample("all_reduce", 2, 1024, 1e-4), Sample("all_reduce", 4, 1024, 2e-4)])
    with pytest.raises(ValueError, match="unknown collective"):
        hops("broadcast", 4)
    with pytest.raises(ValueError, match="n >= 2"):
        wire("all_reduce", 1)
    with pytest.raises(ValueError, match="tree for all_reduce only"):
        hops("all_gather", 8, "tree")


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64, 1024])
def test_ring_all_reduce_is_a_reduce_scatter_then_an_all_gather(n):
    assert hops("all_reduce", n) == hops("reduce_scatter", n) + hops("all_gather", n) == 2 * (n - 1)
    assert wire("all_reduce", n) == pytest.approx(wire("reduce_scatter", n) + wire("all_gather", n))
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):  # the planner's bytes on the wire
        assert wire(op, n) == pytest.approx(wire_factor(op, n))
    assert hops("send_recv", n) == 1 and wire("send_recv", n) == 1.0
    assert hops("all_reduce", n, "tree") == 2 * math.ceil(math.log2(n)) and wire("all_reduce", n, "tree") == 2.0


@pytest.mark.parametrize("n", [8, 64, 1024])
def test_ring_and_tree_cost_the_same_at_the_crossover(n):
    link = LINKS["nvlink"]
    crossover = ring_tree_crossover_bytes(n, link.alpha, link.beta)
    ring, tree = (link.seconds("all_reduce", n, crossover, a) for a in ("ring", "tree"))
    assert ring == pytest.approx(tree, rel=1e-12)
    assert cheaper_algorithm(n, crossover / 2, link) == "tree" and cheaper_algorithm(n, crossover * 2, link) == "ring"
    assert ring_tree_crossover_bytes(3, link.alpha, link.beta) == 0.0  # 4 ring steps, 4 tree steps


def test_the_links_are_the_planners_presets():
    h100 = HARDWARE["h100-sxm"]
    assert LINKS["nvlink"].beta == h100.intra_node_gbs * 1e9 == 360e9
    assert LINKS["infiniband"].beta == h100.inter_node_gbs * 1e9 == 45e9
    assert LINKS["pcie"].beta == 32e9 * 0.75
    assert [LINKS[k].alpha for k in ("nvlink", "infiniband", "pcie")] == [1e-6, 5e-6, 2e-6]


def test_the_exercises_answers_are_the_models():
    nvlink = LINKS["nvlink"]
    milliseconds = predict_seconds("all_reduce", 8, 2**30, nvlink.alpha, nvlink.beta) * 1e3
    assert EXERCISES["00b.1"].solution.startswith(f"{milliseconds:.3g} ms")
    assert "14 x 1 us" in EXERCISES["00b.1"].solution and "1.75 x 2**30" in EXERCISES["00b.1"].solution
    assert "alpha = 1 us" in EXERCISES["00b.1"].question and "360 GB/s" in EXERCISES["00b.1"].question
    assert check_within("00b.1", None, milliseconds) == UNANSWERED
    assert check_within("00b.1", 5.2, milliseconds) == RIGHT
    assert check_within("00b.1", 2 * milliseconds, milliseconds) == WRONG
    assert check_within("00b.1", "fast", milliseconds) == WRONG
    truth = {"1 KiB": cheaper_algorithm(8, 2**10, nvlink), "1 GiB": cheaper_algorithm(8, 2**30, nvlink)}
    assert truth == {"1 KiB": "tree", "1 GiB": "ring"}
    assert check("00b.2", {"1 KiB": "tree", "1 GiB": "ring"}, truth) == RIGHT
    assert check("00b.2", {"1 KiB": "ring", "1 GiB": "ring"}, truth) == WRONG
    text = EXERCISES["00b.2"].solution + EXERCISES["00b.2"].hint
    assert fmt_bytes(ring_tree_crossover_bytes(8, nvlink.alpha, nvlink.beta)) in text
    assert f"2(n-1) = {hops('all_reduce', 8)}" in text and f"2 log2(n) = {hops('all_reduce', 8, 'tree')}" in text
    assert f"2(n-1)/n = {wire('all_reduce', 8):g}" in text and "6 steps instead of 14" in text


def _markdown(name: str) -> str:
    cells = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4).cells
    return "\n".join(cell.source for cell in cells if cell.cell_type == "markdown")


def test_every_number_the_notebook_states_is_the_models():
    """00b's sentences with numbers: the ring's and the tree's steps and bytes, the sizes measured, the
    NVLink alpha, a thousand ranks' thousands of steps, and the places the planner's links predict."""
    from launch.notebook.collectives_lesson import SIZES as LESSON_SIZES

    text = _markdown("00b_collectives")
    assert "$2(n-1)$ steps" in text and "$n-1$ pieces of $M/n$ bytes" in text
    assert all(hops("all_gather", n) == n - 1 and hops("all_reduce", n) == 2 * (n - 1) for n in (2, 8, 1000))
    assert "$2\\lceil\\log_2\nn\\rceil$ steps" in text and "about $2M$ bytes" in text and "$2(n-1)/n \\cdot M$" in text
    assert "1 KiB to 1 MiB" in text and (fmt_bytes(LESSON_SIZES[0]), fmt_bytes(LESSON_SIZES[-1])) == (
        "1.0 KiB",
        "1.0 MiB",
    )
    parameters = nbformat.read(NOTEBOOKS_DIR / "00b_collectives.ipynb", as_version=4).cells[1].source
    assert f"sizes = {list(LESSON_SIZES)}" in parameters
    assert "at a thousand ranks the latency alone is thousands of $\\alpha$" in text
    assert hops("all_reduce", 1000) >= 1000
    assert "on NVLink about a microsecond" in text and LINKS["nvlink"].alpha == 1e-6
    assert "(8 GPUs on NVLink), 8 GPUs on PCIe" in text
    assert re.findall(r"\d+", text.split("## The same model")[1].split("##")[0]) == ["8", "8"]


def test_the_link_table_and_the_widget_compute_with_the_model():
    from launch.notebook.collectives_lesson import Measured, link_rows, ring_tree_rows
    from launch.notebook.widgets import AlphaBetaWidget

    fits = fit(_synthetic(150e-6, 1.2e9))
    measured = Measured([{"op": "all_reduce", "n": 4, "bytes": 1024, "seconds": 1e-3}], [], fits, 0.0)
    rows = link_rows(measured)
    assert [row[0] for row in rows][1:] == [
        "NVLink (8 x H100 in a node), 8 ranks",
        "PCIe 4.0 x16, 8 ranks",
        "InfiniBand (across H100 nodes), 1024 ranks",
    ]
    assert rows[1][-1] == f"{LINKS['nvlink'].seconds('all_reduce', 8, 2**30) * 1e3:.3g}"
    assert rows[0][-2] == f"{predict_seconds('all_reduce', 4, 2**20, 150e-6, 1.2e9) * 1e3:.3g}"
    first = ring_tree_rows(LINKS["nvlink"])[0]
    assert first == ["8", "14", "6", "1.750", "2.000", "11.0 MiB", "tree", "ring"]
    widget = AlphaBetaWidget(LINKS)
    widget.set(op="all_gather", link="infiniband", ranks=1024, size=1 << 20)
    assert widget.seconds == pytest.approx(LINKS["infiniband"].seconds("all_gather", 1024, 1 << 20))
    assert "1023 steps" in widget.text and "tree" not in widget.text
    with pytest.raises(ValueError, match="no selector"):
        widget.set(colour="red")


def test_the_figures_draw_the_fit_and_the_links():
    from hyper_parallel.viz.collectives import collectives_figure, links_figure

    samples = _synthetic(150e-6, 1.2e9)
    rows = [{"op": s.op, "n": s.n, "bytes": s.nbytes, "seconds": s.seconds} for s in samples]
    fig = collectives_figure(rows, fit(samples))
    assert len(fig.axes) == len(COLLECTIVES) and all(len(ax.lines) == 4 for ax in fig.axes)  # 2 sizes x (points, fit)
    fig = links_figure([(LINKS["nvlink"], 8), (LINKS["infiniband"], 1024)], (LINKS["nvlink"], 8))
    assert [len(ax.lines) for ax in fig.axes] == [2, 3]


@pytest.mark.distributed
def test_collectives_on_the_warm_pool_fit_and_the_identity_holds_bit_for_bit():
    """Two ranks, two sizes: every collective timed, bytes rounded to whole float32 chunks, and the
    all-reduce's result equal to reduce-scatter + all-gather's to the bit."""
    from launch.notebook.collectives_lesson import measure_collectives

    measured = measure_collectives(world_sizes=(2,), sizes=(1000, 8192), repeats=2, timeout=300)
    assert [(r["op"], r["bytes"]) for r in measured.rows] == [(op, b) for b in (1000, 8192) for op in COLLECTIVES]
    assert all(r["seconds"] > 0 and r["n"] == 2 for r in measured.rows)
    assert [(r["bytes"], r["max_abs_diff"]) for r in measured.identity] == [(1000, 0.0), (8192, 0.0)]
    assert all(r["all_reduce"] > 0 and r["reduce_scatter"] > 0 and r["all_gather"] > 0 for r in measured.identity)
    assert set(measured.fits) == set(COLLECTIVES)
