"""The eager mini transformer's saved tensors, item by item (cost_model.eager_saved), against autograd.

The items are derived from shapes alone; the measurement is ``SavedActivations`` on the recipes' model in
this process; the reconciliation starts from the cost model's own estimate. All three must agree to the
byte (M2 and M3 on their tp ranks: tests/test_tp_sp_traces.py)."""

from __future__ import annotations

import pytest
import torch

from hyper_parallel.cost_model import recipe_model
from hyper_parallel.cost_model.eager_saved import activation_reconciliation, eager_saved_items
from hyper_parallel.cost_model.memory import activation_bytes
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.models.transformer import Transformer, lm_loss, token_batch
from hyper_parallel.recipes.activation_memory import SavedActivations
from hyper_parallel.recipes.transformer import DENSE_CONFIG

ALONE = ParallelDims(world_size=1)


def _measured_alone() -> int:
    torch.manual_seed(0)
    model = Transformer(DENSE_CONFIG)
    tokens, targets = token_batch(DENSE_CONFIG, recipe_model("M2").global_batch, 0)
    saved = SavedActivations(model)
    with saved.measure():
        lm_loss(model(tokens), targets)
    return saved.bytes


def test_the_items_are_what_autograd_saves_on_one_process():
    items = eager_saved_items(recipe_model("M2"), ALONE)
    assert sum(items.values()) == _measured_alone() == 570.5 * 1024 + 4  # + the loss's weight sum


def test_the_reconciliation_starts_at_the_cost_model_and_ends_at_the_items():
    for recipe, dims in (
        ("M2", ALONE),
        ("M2", ParallelDims(world_size=2, tp=2)),
        ("M3", ParallelDims(world_size=2, tp=2)),
        ("M3", ParallelDims(world_size=4, tp=4)),
    ):
        config = recipe_model(recipe)
        rows = activation_reconciliation(config, dims)
        assert rows[0][1] == activation_bytes(config, dims)
        assert sum(n for _, n in rows) == sum(eager_saved_items(config, dims).values()), (recipe, dims)


def test_sequence_parallel_halves_only_the_norms_and_the_residual_stream():
    """M2 -> M3 on tp 2 (hand-derived, 128 tokens of float32): the norms' input, normalized x and rstd
    (4 d + 2 per token and layer, 2 layers, then 2 d + 1 for the final norm) drop to half."""
    m2 = eager_saved_items(recipe_model("M2"), ParallelDims(world_size=2, tp=2))
    m3 = eager_saved_items(recipe_model("M3"), ParallelDims(world_size=2, tp=2))
    d, tokens = DENSE_CONFIG.d_model, 8 * DENSE_CONFIG.seq_len
    saving = (2 * (4 * d + 2) + (2 * d + 1)) * tokens * 4 / 2
    assert sum(m2.values()) - sum(m3.values()) == saving == 81.25 * 1024


@pytest.mark.parametrize(
    "recipe,degrees,rule",
    [
        ("S1", {"world_size": 2, "ep": 2, "dp_shard": 2}, "no MoE layers"),
        ("M5", {"world_size": 4, "cp": 2, "dp_shard": 2}, "cp = 1"),
    ],
)
def test_other_models_are_refused_with_the_rule(recipe, degrees, rule):
    with pytest.raises(ValueError, match=rule):
        eager_saved_items(recipe_model(recipe), ParallelDims(**degrees))
