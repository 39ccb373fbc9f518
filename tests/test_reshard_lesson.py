"""Notebook 05's resharding lesson: a DCP checkpoint saved on FSDP over 4 gloo ranks, loaded on HSDP 2 x 2.

What its text says, checked on the run: the watched weight ``blocks.0.w1.weight`` ([64, 32], w1 of d_model 32
-> hidden 64) is saved as 4 row shards of 16 and loaded as 2 row shards of 32 held by both replicas (so each
loading rank reads two saved pieces whole); the first loss after the load is bit-equal to the run that never
stopped (a forward of exactly read weights); the next one within float32 rounding of the sum orders
(tolerance 1e-6 on losses near 1, about 8 float32 ulps). Without the load the fresh model (seed 1) is far off.
"""

from __future__ import annotations

import pytest
from worker_results import run_worker

from launch.notebook.checkpoint_lesson import reshard_text


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    return run_worker("reshard_worker", 4, tmp_path_factory.mktemp("reshard"), "reshard", timeout=180)


@pytest.mark.distributed
def test_the_layouts_are_fsdp_four_then_hsdp_two_by_two(found):
    for rank in found:
        assert rank["saved_as"] == {
            "mesh": {"fsdp": 4},
            "placements": ["S(0)"],
            "local_shape": [16, 32],
            "global_shape": [64, 32],
        }
        assert rank["loaded_as"] == {
            "mesh": {"dp_replicate": 2, "fsdp": 2},
            "placements": ["R", "S(0)"],
            "local_shape": [32, 32],
            "global_shape": [64, 32],
        }
        assert rank["loaded_as"]["local_shape"][0] == 2 * rank["saved_as"]["local_shape"][0]  # two saved pieces


@pytest.mark.distributed
def test_the_resumed_run_trains_as_the_one_that_never_stopped(found):
    for rank in found:
        assert rank["resumed"][0] == rank["straight"][0]
        assert max(abs(a - b) for a, b in zip(rank["straight"], rank["resumed"])) < 1e-6
        assert rank["resumed"] == found[0]["resumed"]  # every rank reports the global mean


def test_the_fresh_model_differs_before_the_load():
    """The check above can fail: the fresh model on HSDP (seed 1) without the checkpoint gives another loss."""
    import torch
    import torch.nn.functional as F

    from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch

    x, y = mlp_batch(MLPConfig(), 16, 0)
    losses = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        losses.append(F.mse_loss(MLP(MLPConfig())(x), y).item())
    assert abs(losses[0] - losses[1]) > 1e-3


@pytest.mark.distributed
def test_the_text_says_what_the_run_found(found):
    text = reshard_text(found[0])
    assert "('S(0)',) on (fsdp=4), this rank's piece [16, 32] of [64, 32]" in text
    assert "('R', 'S(0)') on (dp_replicate=2 x fsdp=2), this rank's piece [32, 32]" in text
    assert "first loss after the load bit-equal: True" in text
