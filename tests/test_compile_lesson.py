"""Notebook 07's torch.compile lesson: M4's MLP on 2 gloo ranks under fully_shard, eager and with each block
compiled (``block.compile(backend="aot_eager", fullgraph=True)``).

By hand, one step on 2 ranks (float32): forward gathers the root (inp 16*32 + 32 and head 32*8 + 8 = 808
parameters, 3232 B) and each block (4224 parameters, 16896 B); backward gathers the two blocks again
(the root stays gathered) and reduce-scatters block 1, block 0 and the root: 8 collectives. The compiled run
must show exactly the eager one's (op, group, unit, phase, bytes) sequence and the same losses bit for bit
(aot_eager runs the same kernels), with one graph captured for both blocks and no graph break.
"""

from __future__ import annotations

import pytest
from worker_results import run_worker

from launch.notebook.compile_lesson import compile_text

ROOT, BLOCK = (16 * 32 + 32 + 32 * 8 + 8) * 4, (32 + 32 * 64 + 64 + 64 * 32 + 32) * 4
BY_HAND = [
    ["all_gather", "fsdp", "root", "forward", ROOT],
    ["all_gather", "fsdp", "blocks.0", "forward", BLOCK],
    ["all_gather", "fsdp", "blocks.1", "forward", BLOCK],
    ["all_gather", "fsdp", "blocks.1", "backward", BLOCK],
    ["all_gather", "fsdp", "blocks.0", "backward", BLOCK],
    ["reduce_scatter", "fsdp", "blocks.1", "backward", BLOCK],
    ["reduce_scatter", "fsdp", "blocks.0", "backward", BLOCK],
    ["reduce_scatter", "fsdp", "root", "backward", ROOT],
]


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    return run_worker("compile_worker", 2, tmp_path_factory.mktemp("compile"), "compile", timeout=300)


@pytest.mark.distributed
def test_compiling_the_blocks_leaves_fully_shards_collectives_and_losses(found):
    for rank in found:
        eager, compiled = rank["eager"], rank["compiled"]
        for step in (0, 1):
            assert [c[:5] for c in compiled["collectives"] if c[5] == step] == BY_HAND
        assert compiled["collectives"] == eager["collectives"]
        assert compiled["losses"] == eager["losses"]
        assert (compiled["graphs"], compiled["graph_breaks"]) == (1, 0)


@pytest.mark.distributed
def test_the_text_says_what_the_traces_hold(found):
    text = compile_text(found[0])
    assert "collectives per step: eager 8, compiled 8; the same sequence (op, group, unit, phase, bytes): True" in text
    assert "(bit-equal: True)" in text and "1 graph(s) captured for the blocks, 0 graph break(s)" in text
