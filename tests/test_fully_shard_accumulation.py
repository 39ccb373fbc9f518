"""fully_shard's gradient accumulation (docs/design.md §3, case 9; worker
tests/workers/fully_shard_accumulation_cases.py): two micro-batches per step with reduction switched off
for the first (set_requires_gradient_sync under FSDP, set_requires_all_reduce under HSDP), checked
against one process's step on the whole global batch (numbers) and against the hand-derived collectives
of each micro-batch (no reduce-scatter, or no all-reduce, until the last); gradients of parameters used
only in the first micro-batch must still arrive.
"""

from __future__ import annotations

import pytest
from fully_shard_expectations import (
    BLOCK_S2,
    BLOCK_S4,
    FSDP4,
    HSDP_FSDP,
    HSDP_REP,
    ROOT_S4,
    assert_collectives,
    assert_numbers,
    fsdp_unit,
    hsdp_step,
)

pytestmark = pytest.mark.distributed

# ================================================================== case 9: gradient accumulation


def test_case9_gradient_accumulation_fsdp_sync_off_then_on(fully_shard_run4):
    """Two micro-batches per step (trace steps 2k, 2k+1): set_requires_gradient_sync(False) -> the
    first micro-batch only gathers (no RS); True -> the second reduces the sum; == one step on the
    global batch."""
    results = fully_shard_run4.case("c9_accumulation_fsdp")
    assert_numbers(results, "ours-ref")

    def expected(rank, micro):
        g, sync = FSDP4[rank], micro % 2 == 1
        return (
            fsdp_unit("root", "fsdp", g, ROOT_S4, root=True, reduce=sync)
            + fsdp_unit("blocks.0", "fsdp", g, BLOCK_S4, reduce=sync)
            + fsdp_unit("blocks.1", "fsdp", g, BLOCK_S4, reduce=sync)
        )

    assert_collectives(results, expected, steps=(0, 1, 2, 3))
    for _rank, result in results.items():
        assert result["facts"]["grad_after_first_micro"] == {"0": [], "1": []}  # nothing reduced yet


def test_case9_gradient_accumulation_hsdp_all_reduce_off_then_on(fully_shard_run4):
    """HSDP, set_requires_all_reduce(False) on the first micro-batch: RS on fsdp but no AR; True on
    the second: RS + AR of the accumulated sum on dp_replicate."""
    results = fully_shard_run4.case("c9_accumulation_hsdp")
    assert_numbers(results, "ours-ref")

    def expected(rank, micro):
        return hsdp_step(HSDP_FSDP[rank], HSDP_REP[rank] if micro % 2 == 1 else None, BLOCK_S2)

    assert_collectives(results, expected, steps=(0, 1, 2, 3))


@pytest.mark.parametrize("case", ["c9_accumulation_unused_fsdp", "c9_accumulation_unused_hsdp"])
def test_case9_accumulation_keeps_gradients_of_parameters_used_only_in_earlier_micro_batches(fully_shard_run4, case):
    """Head 0 runs only in the first micro-batch, with synchronisation off: its gradient (parked, or
    reduce-scattered and waiting for the all-reduce) must still arrive when the second micro-batch
    synchronises, equal to one process's gradient of both losses."""
    results = fully_shard_run4.case(case)
    for result in results.values():
        assert result["facts"]["missing_grads"] == []
    assert_numbers(results, "ours-ref", kinds=("grad",))
