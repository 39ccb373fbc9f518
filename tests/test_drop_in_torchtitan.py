"""Our fully_shard inside torchtitan: its Llama3 debug model trained through its own ``parallelize_llama``
with the ``fully_shard`` it calls replaced by ours, against the same run with torch FSDP2 (issue 28).

``tests/workers/drop_in_torchtitan_worker.py`` (one 4-rank gloo launch) builds the model the way
torchtitan's trainer does (config, ``set_determinism``, ``ParallelDims``, ``parallelize_llama``, which ends
with ``disable_fsdp_gradient_division``; ``init_weights``; its token-sum loss; its ``clip_grad_norm_``) and
trains 3 AdamW steps on the same seeded tokens, once per arm; the worker's docstring lists what is
scaled down for the CPU and why. Held to torch FSDP2:

* ``fsdp4``, ``fsdp4_bf16_params`` (torchtitan's default bf16 parameters, fp32 reduction) and
  ``meta_init_fsdp4``: bit for bit (difference 0) in the losses, grad norms, every gradient (before
  clipping) and every parameter. Both arms issue the same reduce-scatters over the same buffers and
  divide by the same factor (1.0 once torchtitan has recognised the units as FSDP2's), so nothing can
  differ. A unit torchtitan does not recognise keeps dividing by the 4 ranks: grad norms ours/FSDP2 =
  0.25, which is what the code before issue 28 did.
* ``tp2_fsdp2`` (TP 2 x FSDP 2, sequence parallel): the losses and the TP-sharded weights' gradients are
  bit-equal, but each RMSNorm weight's gradient is a sum of 4 fp32 contributions (2 TP x 2 FSDP ranks)
  added in another order (FSDP2 all-reduces the TP partial sum first, then reduce-scatters; ours
  reduce-scatters, then sums over TP), so it may differ by a few ulp of the sum: measured <= 2.8e-9
  absolute on gradients of ~1e-2. That changes the global grad norm by a few ulp (rtol 1e-5, measured
  9e-7), hence the clip factor, hence every update lr * m/sqrt(v) by the same relative amount, and the
  parameters by rounding at their magnitude: the RMSNorm weights start at 1.0, whose ulp is 1.2e-7;
  measured 6.0e-7 (5 ulp) after 3 steps; held to 1e-5. A real fault is far outside: a missing or
  double-counted gradient moves a parameter by ~lr = 8e-4 in the first step.

``meta_init_fsdp4`` (meta-device build, ``to_empty``, ``init_weights`` after parallelize, the trainer's
own path) needs ours to re-link its shards in ``_apply``: it is its own case so it can be checked
alone: ``pytest tests/test_drop_in_torchtitan.py -k meta``.

torchtitan and what its model and parallelize code import are not in the dev extras: the test skips
without them (``REQUIRED`` says what to install).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest

from launch.processes.supervisor import torchrun

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).parent / "workers" / "drop_in_torchtitan_worker.py"
REQUIRED = {
    "torchtitan": "torchtitan",
    "spmd_types": "spmd_types",
    "tyro": "tyro",
    "docstring_parser": "docstring-parser",
    "triton": "triton",
}
"""import name -> distribution: torchtitan 0.3 installed with ``--no-deps`` (its declared dependencies
pull datasets, tensorboard, wandb...), plus what importing its Llama3 model and parallelize needs:
spmd_types, tyro (and its docstring-parser), triton (imported by its MoE token dispatcher at import)."""
TORCHTITAN_SERIES = "0.3."  # model/parallelize paths and the config classes the worker uses
BIT_EQUAL = ("fsdp4", "fsdp4_bf16_params")
META_INIT = "meta_init_fsdp4"
CLOSE = "tp2_fsdp2"
GRAD_ATOL = 1e-7  # measured 2.8e-9 on gradients of ~1e-2
GRAD_NORM_RTOL = 1e-5  # measured 9e-7
PARAM_ATOL = 1e-5  # measured 6.0e-7
UNITS = 2 + 3  # fully_shard calls of apply_fsdp_to_decoder: 2 blocks, tok_embeddings, [norm, lm_head], root


def missing_packages() -> list[str]:
    return [dist for name, dist in REQUIRED.items() if importlib.util.find_spec(name) is None]


def skip_reason() -> str | None:
    missing = missing_packages()
    if missing:
        return (
            f"torchtitan drop-in test needs {', '.join(missing)}: "
            "pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 tyro==1.0.17 docstring-parser==0.18.0 triton==3.9.0"
        )
    version = importlib.metadata.version("torchtitan")
    if not version.startswith(TORCHTITAN_SERIES):
        return f"torchtitan {version} installed; this test is written for {TORCHTITAN_SERIES}x"
    return None


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("drop_in_torchtitan")
    run = torchrun(str(WORKER), 4, args=["--out", str(out)], timeout=900, run_dir=out)
    if not run.ok:
        pytest.fail(f"4-rank launch failed:\n{run.error}", pytrace=False)
    return [json.loads((out / f"torchtitan_rank{r}.json").read_text()) for r in range(4)]


def case_results(results: list[dict], name: str) -> list[dict]:
    for rank, per_rank in enumerate(results):
        assert "error" not in per_rank[name], f"{name}, rank {rank}:\n{per_rank[name]['error']}"
    return [per_rank[name] for per_rank in results]


def assert_bit_equal(results: list[dict], name: str) -> None:
    for rank, result in enumerate(case_results(results, name)):
        ours, theirs = result["ours"], result["torch"]
        ratios = [a / b for a, b in zip(ours["grad_norms"], theirs["grad_norms"])]
        assert ours["grad_norms"] == theirs["grad_norms"], f"rank {rank}: grad norms ours/FSDP2 {ratios}"
        assert ours["losses"] == theirs["losses"], (rank, ours["losses"], theirs["losses"])
        assert result["diff"]["grad_names_equal"] == [True] * len(ours["losses"]), rank
        assert result["diff"]["grads"] == [0.0] * len(ours["losses"]), (rank, result["diff"])
        assert result["diff"]["params"] == 0.0, (rank, result["diff"])


@pytest.mark.parametrize("name", BIT_EQUAL)
def test_bit_equal_to_torch_fsdp2(results, name):
    assert_bit_equal(results, name)


def test_meta_init_then_init_weights_bit_equal_to_torch_fsdp2(results):
    """torchtitan's trainer path: build on meta, parallelize, ``to_empty(device="cpu")``, ``init_weights``
    (on the DTensor shards, seeded by torchtitan's ``set_determinism``)."""
    assert_bit_equal(results, META_INIT)


def test_tp2_fsdp2_equal_to_torch_fsdp2_up_to_summation_order(results):
    for rank, result in enumerate(case_results(results, CLOSE)):
        ours, theirs = result["ours"], result["torch"]
        assert ours["losses"] == theirs["losses"], (rank, ours["losses"], theirs["losses"])
        for a, b in zip(ours["grad_norms"], theirs["grad_norms"]):
            assert abs(a - b) <= GRAD_NORM_RTOL * abs(b), (rank, ours["grad_norms"], theirs["grad_norms"])
        assert result["diff"]["grad_names_equal"] == [True] * len(ours["losses"]), rank
        assert max(result["diff"]["grads"]) <= GRAD_ATOL, (rank, result["diff"])
        assert result["diff"]["params"] <= PARAM_ATOL, (rank, result["diff"])


@pytest.mark.parametrize("name", (*BIT_EQUAL, CLOSE, META_INIT))
def test_torchtitan_sees_our_units_as_fsdp2(results, name):
    """torchtitan recognises FSDP2 by ``isinstance(module, FSDPModule)`` (disable_fsdp_gradient_division),
    and its parallelize shards the same units with either fully_shard."""
    for result in case_results(results, name):
        assert result["ours"]["is_fsdp_module"] is True
        assert result["ours"]["fully_shard_calls"] == result["torch"]["fully_shard_calls"] == UNITS
