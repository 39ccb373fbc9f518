"""Our reduce-scatter on gloo (hyper_parallel.gloo_sum): gloo's numbers bit for bit at the ring bound.

One 4-rank launch (tests/workers/gloo_sum_cases.py) compares ``comm.reduce_scatter_tensor`` with gloo's own
``reduce_scatter_tensor`` on groups of 2, 3 and 4 ranks, four dtypes, sizes whose ring chunks do and do not
line up with the output chunks, and one fp32 buffer large enough for gloo's 1 MiB segment cap to move the
boundaries; and counts the bytes each rank writes per collective. The summation plan itself is arithmetic
and is checked here against hand-derived chunk sizes.
"""

from __future__ import annotations

import pytest
import torch
from worker_results import run_worker

from hyper_parallel.gloo_sum import SummedPiece, fold, ring_chunk_numel, ring_order, summation_plan

HEADER_ALLOWANCE = 0.01  # gloo's per-message headers: a few dozen bytes per 256 KiB or more


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_worker("gloo_sum_cases", 4, tmp_path_factory.mktemp("gloo_sum"), "gloo_sum", timeout=600)


def test_ring_chunks_follow_the_segment_rounding():
    # 36 fp32 over 4: 8 segments of ceil(144 / 8) = 18 -> 20 bytes (5 elements), chunks of 10, not 9
    assert ring_chunk_numel(36, 4, 4) == 10
    assert ring_chunk_numel(64, 4, 4) == 16
    # 6000004 fp32 over 4: 24 MB in segments of at most 1 MiB -> 24 segments of 1000001 bytes -> 1000004,
    # 6 per chunk: 1500006 elements (without the cap: 8 segments, chunks of 1500002)
    assert ring_chunk_numel(6000004, 4, 4) == 1500006
    assert ring_order(0, 4) == (3, 2, 1, 0) and ring_order(2, 3) == (1, 0, 2)


def test_plan_gives_boundary_elements_their_ring_chunks_order():
    # position 2 of 4 owns [18, 27) of 36 elements; ring chunk 1 is [10, 20), ring chunk 2 [20, 30)
    assert summation_plan(36, 4, 2, 4) == [SummedPiece(0, 2, (0, 3, 2, 1)), SummedPiece(2, 9, (1, 0, 3, 2))]
    assert summation_plan(64, 4, 1, 4) == [SummedPiece(0, 16, (0, 3, 2, 1))]
    with pytest.raises(ValueError, match="equal chunks"):
        summation_plan(10, 4, 0, 4)


def test_fold_rounds_every_addition_in_the_dtype():
    received = torch.tensor([[1.0], [2.0**-8], [2.0**-8]], dtype=torch.bfloat16)
    out = torch.empty(1, dtype=torch.bfloat16)
    fold(received, out, [SummedPiece(0, 1, (0, 1, 2))])  # (1 + 2^-8) rounds to 1 in bf16, twice
    assert out.item() == 1.0
    fold(received, out, [SummedPiece(0, 1, (1, 2, 0))])  # 2^-7 first, then 1 + 2^-7 is exact
    assert out.item() == 1.0 + 2.0**-7


@pytest.mark.distributed
def test_reduce_scatter_equals_gloo_bit_for_bit(ranks):
    boundary_elements = 0
    for per_rank in ranks:
        for name, rows in per_rank.items():
            if not name.startswith("exact_"):
                continue
            assert not isinstance(rows, dict), rows.get("error")
            for row in rows:
                assert row["differ"] == 0 and row["differ_async"] == 0, row
                boundary_elements += row["owner_order_differs"]
    # the sizes reach elements a plain ring (ending at the owner) would sum in another order than gloo
    assert boundary_elements > 0


@pytest.mark.distributed
def test_every_collective_writes_the_ring_bound(ranks):
    for per_rank in ranks:
        for name in ("wire_2", "wire_4"):
            ratios = per_rank[name]
            if not ratios:  # a rank outside the group
                continue
            assert "error" not in ratios, ratios["error"]
            for op in ("reduce_scatter", "all_gather", "all_reduce"):
                assert 1.0 <= ratios[op] <= 1.0 + HEADER_ALLOWANCE, (name, op, ratios)
            # gloo's own reduce_scatter is an all-reduce: twice the bound, which the measure must see
            assert ratios["gloo reduce_scatter"] >= 2.0 - HEADER_ALLOWANCE, (name, ratios)
