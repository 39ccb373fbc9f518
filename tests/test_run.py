"""`launch.run`: a recipe end to end through torchrun, checked against its single-process reference."""
from __future__ import annotations

from collections import Counter

import pytest

import launch
import launch.runner as launch_run


def collectives(result, rank: int, step: int) -> Counter:
    return Counter((e["op"], e["group"], tuple(e["ranks"])) for e in result.traces[rank]
                   if e["kind"] == "collective" and e["step"] == step)


def test_invalid_degrees_raise_before_any_worker(monkeypatch):
    def no_workers(*args, **kwargs):
        raise AssertionError("torchrun was called")
    monkeypatch.setattr(launch_run, "torchrun", no_workers)
    with pytest.raises(ValueError, match="world-size equation violated"):
        launch.run("M4", world_size=4, dp_shard=3)
    with pytest.raises(ValueError, match="needs dp_replicate=1, got dp_replicate=2"):
        launch.run("M4", world_size=2, dp_replicate=2, dp_shard=1)
    with pytest.raises(ValueError, match="needs dp_shard > 1"):
        launch.run("M4", world_size=1, dp_shard=1)
    with pytest.raises(ValueError, match="unknown recipe"):
        launch.run("M99")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        launch.run("M4", steps=0)


@pytest.mark.distributed
@pytest.mark.l0
def test_m1_on_two_meshes_matches_reference_and_itself(tmp_path):
    """M1 (DDP via fully_shard(enable_param_shard=False)) on 2 ranks and on 4 ranks (HSDP-shaped mesh).

    The global batch is fixed per recipe, so both runs must reproduce the same reference losses."""
    two = launch.run("M1", steps=2, out=tmp_path / "two", world_size=2, dp_shard=2)
    four = launch.run("M1", steps=2, out=tmp_path / "four", world_size=4, dp_replicate=2, dp_shard=2)
    for result in (two, four):
        assert result.ok, result.error
        assert result.metrics["max_abs_diff"] <= 1e-5 * max(result.metrics["reference_losses"])
    assert two.metrics["reference_losses"] == four.metrics["reference_losses"]
    assert two.metrics["losses"] == pytest.approx(four.metrics["losses"], rel=1e-6)
    # M1 units (blocks.0, blocks.1, root) each all-reduce once over the whole data-parallel group, no RS / AG.
    for rank in range(2):
        assert collectives(two, rank, 1) == Counter({("all_reduce", "dp_replicate+fsdp", (0, 1)): 3})
    assert collectives(four, 3, 1) == Counter({("all_reduce", "dp_replicate+fsdp", (0, 1, 2, 3)): 3})


@pytest.mark.distributed
@pytest.mark.l0
def test_m4_fsdp_traces_and_summary(tmp_path):
    result = launch.run("M4", steps=2, out=tmp_path, world_size=2, dp_shard=2)
    assert result.ok, result.error
    assert (tmp_path / "summary.json").exists() and set(result.traces) == {0, 1}
    # 3 units; the root keeps its parameters after forward (as torch FSDP2), the two blocks re-gather in backward.
    assert collectives(result, 0, 1) == Counter({("all_gather", "fsdp", (0, 1)): 5,
                                                 ("reduce_scatter", "fsdp", (0, 1)): 3})
    assert result.summary()["losses"] == result.metrics["losses"]
