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
def test_m4_fsdp_traces_and_summary(tmp_path):
    result = launch.run("M4", steps=2, out=tmp_path, world_size=2, dp_shard=2)
    assert result.ok, result.error
    assert (tmp_path / "summary.json").exists() and set(result.traces) == {0, 1}
    # 3 units; the root keeps its parameters after forward (as torch FSDP2), the two blocks re-gather in backward.
    assert collectives(result, 0, 1) == Counter({("all_gather", "fsdp", (0, 1)): 5,
                                                 ("reduce_scatter", "fsdp", (0, 1)): 3})
    assert result.summary()["losses"] == result.metrics["losses"]
