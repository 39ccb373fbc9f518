"""Unusual but legitimate training loops on our fully_shard, against one process on the global batch.

``tests/workers/fsdp_edge_cases.py`` runs each case on 4 gloo ranks (one launch) and reports the largest
|gradient - reference| over every parameter (fp32; the same math in another summation order: <= 1e-6).
What each case guards:

* list_unit_frozen_first, frozen_unit_called_twice: a unit called several times in one forward reshards
  only after the input gradients of every call (resharding after the first one frees storage a later
  backward reads: "setStorage ... storage of size 0");
* loss_on_a_feature_not_the_output: backward ends (and reduces) even when the root's output hook never
  fires, because the loss is not computed from the root's output;
* backward_raises_then_training_goes_on: reductions left in flight by a failed backward are drained, so
  the next steps' gradients are right;
* reshard_to_subgroup_then_weights_change: a forward gathers the current weights, not a shard kept from
  an earlier forward;
* reentrant_checkpointing_keeps_its_gathers: the recompute's order is not taken for the forward order,
  so no block prefetches the one just done (the gathers per step stay those of a plain forward);
* frozen_layer_two_backwards_of_one_forward: the counters of a backward are reset when it ends;
* compiled_model_under_torch_compile: the hooks opt out of dynamo when they run (importing fully_shard
  does not import dynamo: ``test_importing_fully_shard_does_not_import_dynamo``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.processes.supervisor import torchrun

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).parent / "workers" / "fsdp_edge_cases.py"
GRADIENT_CASES = (
    "list_unit_frozen_first",
    "frozen_unit_called_twice",
    "frozen_layer_two_backwards_of_one_forward",
    "loss_on_a_feature_not_the_output",
    "backward_raises_then_training_goes_on",
    "reshard_to_subgroup_then_weights_change",
    "compiled_model_under_torch_compile",
)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("edge")
    run = torchrun(str(WORKER), 4, args=["--out", str(out)], timeout=600, run_dir=out)
    if not run.ok:
        pytest.fail(f"4-rank launch failed:\n{run.error}", pytrace=False)
    return [json.loads((out / f"edge_rank{rank}.json").read_text()) for rank in range(4)]


@pytest.mark.parametrize("name", GRADIENT_CASES)
def test_gradients_equal_the_reference(results, name):
    for rank, per_rank in enumerate(results):
        value = per_rank[name]
        assert not isinstance(value, dict), f"rank {rank}:\n{value['error']}"
        assert value <= 1e-6, (rank, value)


def test_reentrant_checkpointing_keeps_its_gathers(results):
    for per_rank in results:
        assert per_rank["reentrant_checkpointing_keeps_its_gathers"] == [10, 10, 10]


@pytest.mark.parametrize("module", ["hyper_parallel.fsdp", "launch.processes.pool_worker"])
def test_importing_fully_shard_does_not_import_dynamo(module):
    """Every warm-pool rank imports fully_shard at start; dynamo and inductor would add 0.45 s to each."""
    import subprocess
    import sys

    probe = f"import sys, {module}; print('torch._dynamo' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
