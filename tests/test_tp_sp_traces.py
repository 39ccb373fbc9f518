"""TP (M2) and TP + SP (M3) on their own traces: the same wire bytes on tp, fewer activations with SP.

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


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    specs = [{"recipe": name, "steps": 2, "world_size": 2, "tp": 2} for name in ("M2", "M3")]
    results = launch.run_many(specs, out=tmp_path_factory.mktemp("tp_sp"), timeout=1200)
    assert all(r.ok for r in results), [r.error for r in results]
    return dict(zip(("M2", "M3"), results))


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
