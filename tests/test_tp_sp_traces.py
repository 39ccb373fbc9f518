"""TP (M2), TP + SP (M3), async TP (M3-A) and float8 TP (M3-F8) on their own traces.

M2 and M3: the same wire bytes on tp, fewer activations with SP.

An all-reduce is a reduce-scatter followed by an all-gather, so with the standard plan (one
collective per block input, ``PrepareModuleInput`` on attention and feed-forward) the two runs send the
same bytes on the tp group; M3 adds only the small all-reduce of its norm weights' partial gradients.
What SP saves is activation memory: the bytes autograd keeps for backward, measured on rank 0 of each
run and bounded above by the same model run in this process on the same batch without any split.
"""

from __future__ import annotations

import pytest
import torch

import launch
from hyper_parallel.models.transformer import Transformer, lm_loss, token_batch
from hyper_parallel.recipes import RECIPES
from hyper_parallel.recipes.activation_memory import SavedActivations
from hyper_parallel.recipes.transformer import DENSE_CONFIG
from launch.notebook.exercises import fewer_saved_activations, tp_wire_bytes

pytestmark = pytest.mark.distributed


TP_RECIPES = ("M2", "M3", "M3-A", "M3-F8")


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    specs = [{"recipe": name, "steps": 2, "world_size": 2, "tp": 2} for name in TP_RECIPES]
    results = launch.run_many(specs, out=tmp_path_factory.mktemp("tp_sp"), timeout=1200)
    assert all(r.ok for r in results), [r.error for r in results]
    return dict(zip(TP_RECIPES, results))


def test_tp_and_tp_sp_send_the_same_bytes_on_tp(tp_runs):
    m2, m3 = tp_wire_bytes(tp_runs["M2"]), tp_wire_bytes(tp_runs["M3"])
    assert m2 > 0 and m3 == pytest.approx(m2, rel=0.05)


def test_sequence_parallel_saves_activations(tp_runs):
    """Rank 0 of each run keeps less than the unsplit model on the same batch (heads and hidden units
    split over tp), and M3 less than M2 (norms and residual stream on a tp-th of the sequence)."""
    torch.manual_seed(0)
    model = Transformer(DENSE_CONFIG)
    tokens, targets = token_batch(DENSE_CONFIG, RECIPES["M2"].shapes["global_batch"], 0)
    saved = SavedActivations(model)
    with saved.measure():
        lm_loss(model(tokens), targets)
    m2, m3 = (tp_runs[label].metrics["saved_activation_bytes"] for label in ("M2", "M3"))
    assert m3 < m2 < saved.bytes
    assert fewer_saved_activations(tp_runs, ["M2", "M3"]) == "M3"


def test_each_runs_saved_activations_are_the_eager_items_to_the_byte(tp_runs):
    """Rank 0 of M2 and M3 saves exactly the tensors cost_model.eager_saved derives from the shapes (424.5 and
    343.3 KiB on tp 2, + the loss's 4-byte weight sum), and notebook 03's table says so row by row."""
    from hyper_parallel.cost_model import recipe_model
    from hyper_parallel.cost_model.eager_saved import eager_saved_items
    from hyper_parallel.mesh import ParallelDims
    from launch.notebook.lessons import activation_reconciliation_rows

    dims = ParallelDims(world_size=2, tp=2)
    for label, kib in (("M2", 424.5), ("M3", 343.25)):
        measured = tp_runs[label].metrics["saved_activation_bytes"]
        assert measured == sum(eager_saved_items(recipe_model(label), dims).values()) == kib * 1024 + 4, label
    rows = activation_reconciliation_rows(tp_runs, ["M2", "M3"])
    assert rows[0][1:] == ["352.0 KiB", "320.0 KiB"]  # the trade-off table's activations (estimate)
    assert rows[-1][1:] == ["424.5 KiB ✔", "343.3 KiB ✔"]


def test_saved_activations_count_each_storage_once_and_skip_parameters():
    """y = w * x saves x and w for backward; x counted once though two products save it, w not at all."""
    weight = torch.nn.Parameter(torch.ones(256))
    module = torch.nn.Module()
    module.weight = weight
    x = torch.randn(256, requires_grad=True)
    saved = SavedActivations(module)
    with saved.measure():
        (x * weight).sum() + (x * weight).sum()
    assert saved.bytes == 256 * 4


def _step_events(result, kind: str, step: int = 1, rank: int = 0) -> list[dict]:
    return [e for e in result.traces[rank] if e["kind"] == kind and e["step"] == step]


def test_async_tp_sends_m3s_bytes_in_chunks(tp_runs):
    """The same bytes on tp as M3, exactly: each block's gather and scatter are cut into tp = 2 chunks of
    half the bytes; the embedding's, the head's and the logits' collectives are M3's."""
    m3, async_tp = tp_runs["M3"], tp_runs["M3-A"]
    assert tp_wire_bytes(async_tp) == tp_wire_bytes(m3)
    for rank in (0, 1):
        chunked = [e for e in _step_events(async_tp, "collective", rank=rank) if e.get("chunk") is not None]
        whole = [e for e in _step_events(m3, "collective", rank=rank) if e["module"].startswith("layers.")]
        assert len(chunked) == 2 * len([e for e in whole if e["op"] != "all_reduce"])
        assert sum(e["bytes"] for e in chunked) == sum(e["bytes"] for e in whole if e["op"] != "all_reduce")
    assert async_tp.metrics["losses"] == pytest.approx(m3.metrics["losses"], rel=1e-6)


def test_async_tp_chunk_in_flight_while_the_other_multiplies(tp_runs):
    """Every chunk 1 of a forward all-gather is in flight (issue to wait) while a compute span begins:
    chunk 0's matmul; every chunk 0 of a forward reduce-scatter while chunk 1's matmul begins. The overlap
    fraction (hidden / in flight of the chunked collectives, what the report and the timeline print) is
    then above 0 on every rank."""
    from hyper_parallel.viz.overlap import chunk_overlap

    result = tp_runs["M3-A"]
    for rank in (0, 1):
        events = result.traces[rank]
        computes = _step_events(result, "compute", rank=rank)
        forward = [e for e in _step_events(result, "collective", rank=rank) if e.get("chunk") is not None]
        forward = [e for e in forward if e["phase"] == "forward"]
        pipelined = [
            e
            for e in forward
            if (e["op"] == "all_gather" and e["chunk"] == 1) or (e["op"] == "reduce_scatter" and e["chunk"] == 0)
        ]
        assert len(pipelined) == 2 * 2 * 2  # layers x (attention, feed-forward) x (gather, scatter)
        for event in pipelined:
            assert any(event["t_start"] <= c["t_start"] < event["t_wait"] for c in computes), (rank, event)
        assert chunk_overlap(events, step=1)["fraction"] > 0


def test_float8_tp_gathers_a_quarter_of_the_bytes(tp_runs):
    """M3-F8 gathers each block input in e4m3 (forward) and each rowwise output's gradient in e5m2
    (backward): 1 byte per value, so those gathers move 1/4 of M3's float32 bytes; the head's input and
    the logits stay float32, and the reduce-scatters (gradients summed) too."""
    m3, low = tp_runs["M3"], tp_runs["M3-F8"]

    def gathers(result, phase):
        return [
            e
            for e in _step_events(result, "collective")
            if e["op"] == "all_gather" and e["phase"] == phase and e["module"].startswith("layers.")
        ]

    for phase, dtype in (("forward", "float8_e4m3fn"), ("backward", "float8_e5m2")):
        float8, float32 = gathers(low, phase), gathers(m3, phase)
        assert {e["dtype"] for e in float8} == {dtype} and {e["dtype"] for e in float32} == {"float32"}
        assert len(float8) == len(float32) == 4  # 2 layers x (attention, feed-forward)
        assert 4 * sum(e["bytes"] for e in float8) == sum(e["bytes"] for e in float32)
    rest = [e for e in _step_events(low, "collective") if not e["dtype"].startswith("float8")]
    assert {e["dtype"] for e in rest} == {"float32"}


def test_float8_tp_loss_within_the_e4m3_bound_of_m3(tp_runs):
    """Step 0, before any update: M3-F8's loss is M3's model in float8, so it differs from M3's by at most
    6 sigma of the rounding error derived from e4m3 (hyper_parallel.parallel.float8.float8_loss_error) on
    the same model and batch, computed here in one process. After step 0 the float8 gradients (e5m2)
    steer the weights apart too; M3-F8 matches its own float8 reference to fp32 rounding (test_recipes)."""
    from hyper_parallel.parallel.float8 import float8_loss_error, record_linear_inputs

    torch.manual_seed(0)
    model = Transformer(DENSE_CONFIG)
    tokens, targets = token_batch(DENSE_CONFIG, RECIPES["M3"].shapes["global_batch"], 0)
    inputs = record_linear_inputs(model)
    lm_loss(model(tokens), targets).backward()
    error = float8_loss_error(model, inputs)
    m3, low = tp_runs["M3"].metrics["losses"][0], tp_runs["M3-F8"].metrics["losses"][0]
    assert 0 < abs(low - m3) <= 6 * error.sigma
