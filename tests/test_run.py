"""`launch.run`: a recipe end to end through torchrun, checked against its single-process reference."""

from __future__ import annotations

from collections import Counter

import pytest

import launch
import launch.runs as launch_run


def collectives(result, rank: int, step: int) -> Counter:
    return Counter(
        (e["op"], e["group"], tuple(e["ranks"]))
        for e in result.traces[rank]
        if e["kind"] == "collective" and e["step"] == step
    )


def test_invalid_degrees_raise_before_any_worker(monkeypatch):
    def no_workers(*args, **kwargs):
        raise AssertionError("torchrun was called")

    monkeypatch.setattr(launch_run, "torchrun_claimed", no_workers)
    monkeypatch.setattr(launch_run, "_run_on_pool", no_workers)
    with pytest.raises(ValueError, match="world-size equation violated"):
        launch.run("M4", world_size=4, dp_shard=3)
    with pytest.raises(ValueError, match="needs dp_replicate=1, got dp_replicate=2"):
        launch.run("M4", world_size=2, dp_replicate=2, dp_shard=1)
    with pytest.raises(ValueError, match="needs dp_shard > 1"):
        launch.run("M4", world_size=1, dp_shard=1)
    with pytest.raises(ValueError, match="unknown recipe"):
        launch.run("M99")
    with pytest.raises(ValueError, match="steps must be a whole number >= 1"):
        launch.run("M4", steps=0)


def test_world_size_is_the_product_of_the_degrees_given():
    """No world_size: the product of the dense degrees given (--tp 4 alone is 4 ranks with dp_shard 1,
    which failed before: "cannot infer dp_shard: world_size=2"); none given: the recipe's default; only
    ep/etp given: they borrow ranks of the recipe's default world."""
    from hyper_parallel.recipes import RECIPES

    _, dims = launch_run.validate("M2", tp=4)
    assert (dims.world_size, dims.dp_shard, dims.tp) == (4, 1, 4)
    assert launch_run.validate("M1", dp_shard=4)[1].world_size == 4
    assert launch_run.validate("M6", dp_shard=2, cp=2, tp=2)[1].world_size == 8
    assert launch_run.validate("M4")[1].world_size == RECIPES["M4"].default["world_size"]
    assert RECIPES["S1"].resolve_degrees({"ep": 2})["world_size"] == RECIPES["S1"].default["world_size"]
    assert RECIPES["M2"].resolve_degrees({"world_size": 8, "tp": 2}) == {"world_size": 8, "tp": 2}


@pytest.mark.distributed
def test_m4_fsdp_traces_and_summary(tmp_path):
    result = launch.run("M4", steps=2, out=tmp_path, world_size=2, dp_shard=2)
    assert result.ok, result.error
    assert (tmp_path / "summary.json").exists() and set(result.traces) == {0, 1}
    # 3 units; the root keeps its parameters after forward (as torch FSDP2), the two blocks re-gather in backward.
    assert collectives(result, 0, 1) == Counter(
        {("all_gather", "fsdp", (0, 1)): 5, ("reduce_scatter", "fsdp", (0, 1)): 3}
    )
    assert result.summary()["losses"] == result.metrics["losses"]


@pytest.mark.distributed
def test_a_result_prints_short_in_a_notebook(recipe_results):
    """A 4-rank run's repr is one line (the dataclass repr of M4 on 4 ranks was 107,415 characters: every
    trace event); its HTML says PASSED with the losses next to the reference's."""
    from conftest import result_of

    from hyper_parallel.recipes import RECIPES

    result = result_of("M7", RECIPES["M7"].default, recipe_results)
    assert result.dims.world_size == 4 and result.ok
    text = repr(result)
    assert len(text) < 2000 and text.startswith("RunResult(M7, world_size=4") and str(result.run_dir) in text
    page = result._repr_html_()
    assert "PASSED" in page and f"{result.metrics['losses'][0]:.6f}" in page
    assert len(repr(result.process)) < 2000
