"""fully_shard's state dicts (docs/design.md §3, case 10, and a regression this suite found; worker
tests/workers/fully_shard_state_dict_cases.py): sharded, full and in-memory DTensor state dicts, and the
DTensor state dict through torch.save, loaded into freshly built models on FSDP 1-D with an uneven head,
checked against the source model's local shards (bit-equal, same shapes, same next step) and the full
state dict and next loss against the single-process reference; no traced collectives.
"""

from __future__ import annotations

import pytest
from fully_shard_expectations import (
    assert_numbers,
)

pytestmark = pytest.mark.distributed

# ================================================================== case 10: state dict


def test_case10_state_dict_round_trip(fully_shard_run4):
    results = fully_shard_run4.case("c10_state_dict")
    assert_numbers(results, "ours-ref", steps=1)
    for rank, result in results.items():
        facts = result["facts"]
        assert facts["state_dict_types"] == ["DTensor"]
        assert facts["state_dict_placements"]["head.weight"] == "(S(0))"
        for key in ("sharded", "full", "in_memory"):
            assert all(facts[f"{key}_local_equal"].values()), (rank, key, facts[f"{key}_local_equal"])
            assert facts[f"{key}_local_shapes"] == facts["local_shapes"]
        assert facts["local_shapes"]["head.weight"] == ([2, 32] if rank < 3 else [0, 32])
        losses = facts["next_step_losses"]
        assert losses["B"] == losses["A"] and losses["C"] == losses["A"] and losses["D"] == losses["A"], losses
        assert facts["next_step_params_equal"] == {"A": True, "B": True, "C": True, "D": True}
        assert result["numbers"]["full_state:ours-ref"]["ratio"] <= 1.0
        assert result["numbers"]["next_loss:ours-ref"]["ratio"] <= 1.0
        assert not [e for e in result["collectives"] if e["step"] == 100]  # state dicts: no traced collectives


# ================================================================== regressions of bugs this suite found


def test_case10_dtensor_state_dict_survives_torch_save(fully_shard_run4):
    """Regression: a unit's shards are views into its flat buffer; the state dict clones those at a
    non-zero offset so torch.save can pickle them."""
    for rank, result in fully_shard_run4.case("c10_state_dict").items():
        assert result["facts"]["dtensor_file_round_trip"] == "ok", (rank, result["facts"]["dtensor_file_round_trip"])
        assert result["facts"]["file_local_equal"] and all(result["facts"]["file_local_equal"].values())
