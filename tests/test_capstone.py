"""Notebook 12 (your own model) says numbers about its own runs; here they are derived by hand and
compared with what the executed notebook measured (the numbers its closing cell writes to
``runs_dir/12_your_own_model.json``).

Derivation for the notebook's model (2 blocks; per block attention wq/wk/wv column-wise, wo row-wise,
feed-forward up column-wise, down row-wise, ``PrepareModuleInput`` on attention and feed_forward) on
dp_shard 2 x tp 2, 3 fully_shard units (2 blocks + root):
    tp all-reduces   forward 2 per block (the row-wise outputs), backward 2 per block (one per block input)
    fsdp             forward 3 all-gathers, backward 2 (the root keeps its parameters), 3 reduce-scatters
    torch FSDP2      the same, plus an all-reduce over the 1-rank dp_replicate group per unit
The meta-built, rank-0-loaded, clipped run is held to torch's clip_grad_norm_ on one process, which the
notebook runs in its kernel; the clipping must act (every step's norm above max_norm).
"""

from __future__ import annotations

import json

import pytest

BLOCKS, UNITS = 2, 3


@pytest.fixture(scope="module")
def capstone(workbook):
    """What notebook 12 wrote when the workbook ran (tests/conftest.py, ``workbook``)."""
    numbers = workbook / "runs" / "12_your_own_model" / "12_your_own_model.json"
    assert numbers.exists(), f"notebook 12 wrote no {numbers.name}: see its executed copy in {workbook}"
    return json.loads(numbers.read_text())


@pytest.mark.distributed
def test_tp_and_fsdp_collectives_are_the_ones_the_text_derives(capstone):
    assert capstone["blocks"] == BLOCKS and capstone["degrees"] == {"dp_replicate": 1, "dp_shard": 2, "tp": 2}
    assert capstone["counts"] == {
        "forward all_reduce tp": 2 * BLOCKS,
        "backward all_reduce tp": 2 * BLOCKS,
        "forward all_gather fsdp": UNITS,
        "backward all_gather fsdp": UNITS - 1,
        "backward reduce_scatter fsdp": UNITS,
    }


@pytest.mark.distributed
def test_the_run_matches_the_reference_torch_fsdp2_and_its_checkpoint(capstone):
    scale = max(abs(v) for v in capstone["reference"])
    assert max(abs(a - b) for a, b in zip(capstone["losses"], capstone["reference"])) <= 1e-5 * scale
    assert max(abs(a - b) for a, b in zip(capstone["ours_bf16"], capstone["torch_bf16"])) <= 1e-2 * scale
    assert capstone["gathered_dtypes"] == {"ours": ["bfloat16"], "torch": ["bfloat16"]}
    ours, theirs = capstone["ours_counts"], capstone["torch_counts"]
    assert ours == {"all_gather fsdp": 2 * UNITS - 1, "reduce_scatter fsdp": UNITS, "all_reduce tp": 4 * BLOCKS}
    assert theirs == dict(ours, **{"all_reduce dp_replicate": UNITS})
    saved = capstone["checkpoint"]
    assert saved["resumed"] == saved["straight"] and saved["before"] != saved["straight"]


@pytest.mark.distributed
def test_the_meta_built_clipped_run_matches_one_process_clipping_with_torch(capstone):
    ranks, reference = capstone["meta_clipped"]["ranks"], capstone["meta_clipped"]["reference"]
    assert ranks["on_meta"] is True
    assert min(reference["norms"]) > capstone["max_norm"]  # the clipping scaled every step
    assert reference["losses"][1:] != capstone["reference"][1:]  # and so changed the training
    scale = max(abs(v) for v in reference["losses"])
    assert max(abs(a - b) for a, b in zip(ranks["losses"], reference["losses"])) <= 1e-5 * scale
    assert max(abs(a - b) for a, b in zip(ranks["norms"], reference["norms"])) <= 1e-5 * max(reference["norms"])
