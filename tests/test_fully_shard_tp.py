"""fully_shard under torch's DTensor tensor parallelism, on 8 ranks (docs/design.md §3, cases 3 and 4;
worker tests/workers/fully_shard_tp_cases.py): TP on tp and fully_shard on (dp_replicate, fsdp), checked
against the single-process reference and torch FSDP2 + TP (numbers), the hand-derived collectives,
GroupInfo and placement transitions (only the fsdp entry changes, the TP placement seen in forward
stays); and experts that are DTensors on (ep, etp) sharded on efsdp next to a TP dense block, checked
against the reference and the hand-derived efsdp / fsdp collectives.
"""

from __future__ import annotations

import pytest
from fully_shard_expectations import (
    ALL_NAMES,
    BLOCK_TP2_S2,
    BLOCK_TP2_S4,
    EXPERTS_S2,
    MESH8_FSDP,
    MESH8_REP,
    ROOT_PARAMS,
    ROOT_S4,
    assert_collectives,
    assert_group_facts,
    assert_numbers,
    fsdp_unit,
    hsdp_step,
    placements,
    split_placements,
    unit_transitions,
)

pytestmark = pytest.mark.distributed

# ================================================================== case 3: dp x tp (8 ranks)


def test_case3_dp_tp_numbers_match_reference_and_torch_fsdp2_tp(fully_shard_run8):
    results = fully_shard_run8.case("c3_dp_tp")
    assert_numbers(results, "ours-ref")
    assert_numbers(results, "torch-ref")
    assert_numbers(results, "ours-torch")


def test_case3_dp_tp_keeps_tp_placement_and_reduces_on_dp_groups(fully_shard_run8):
    """Forward sees w1.weight as a DTensor on tp with Shard(0) (TP placement kept); unshard gathers
    only the fsdp dim; backward: RS on fsdp + AR on dp_replicate, nothing on tp (torch TP's DTensor
    gradients are not partial)."""
    results = fully_shard_run8.case("c3_dp_tp")

    def expected(rank, step):
        return hsdp_step(MESH8_FSDP[rank], MESH8_REP[rank], BLOCK_TP2_S2)

    assert_collectives(results, expected)
    block = {  # name: (mesh dims, sharded, unsharded): only the fsdp entry changes
        "norm.weight": (("dp_replicate", "fsdp"), "(R, S(0))", "(R, R)"),
        "w1.weight": (("dp_replicate", "fsdp", "tp"), "(R, S(1), S(0))", "(R, R, S(0))"),
        "w1.bias": (("dp_replicate", "fsdp", "tp"), "(R, _S(0, 2), S(0))", "(R, R, S(0))"),
        "w2.weight": (("dp_replicate", "fsdp", "tp"), "(R, S(0), S(1))", "(R, R, S(1))"),
        "w2.bias": (("dp_replicate", "fsdp", "tp"), "(R, S(0), R)", "(R, R, R)"),
    }
    root = {name: (("dp_replicate", "fsdp"), "(R, S(0))", "(R, R)") for name in ROOT_PARAMS}
    expected_placements = unit_transitions(root, root=True)
    for b in (0, 1):
        expected_placements += unit_transitions({f"blocks.{b}.{n}": v for n, v in block.items()}, root=False)
    for rank, result in results.items():
        for step in (0, 1):
            assert placements(result, step) == expected_placements, (rank, step)
        assert result["facts"]["forward_w1"] == {
            str(step): {"type": "DTensor", "mesh_dims": ["tp"], "placements": "(S(0))", "local_shape": [32, 32]}
            for step in (0, 1)
        }
    assert_group_facts(
        results,
        ALL_NAMES,
        shard_size=2,
        dp_size=2,
        rank_size=4,
        sharded={r: ("fsdp", MESH8_FSDP[r]) for r in range(8)},
        unsharded={r: ("dp_replicate", MESH8_REP[r]) for r in range(8)},
    )


# ================================================================== case 4: dp x tp x ep (8 ranks)

# ParallelDims(8, dp_shard=4, tp=2, ep=2, etp=2). Dense (dp_replicate 1, fsdp 4, tp 2): rank = 2*fsdp + tp.
# Sparse (dp_replicate 1, efsdp 2, ep 2, etp 2): rank = 4*efsdp + 2*ep + etp.
EP_FSDP = {
    0: [0, 2, 4, 6],
    1: [1, 3, 5, 7],
    2: [0, 2, 4, 6],
    3: [1, 3, 5, 7],
    4: [0, 2, 4, 6],
    5: [1, 3, 5, 7],
    6: [0, 2, 4, 6],
    7: [1, 3, 5, 7],
}
EP_EFSDP = {0: [0, 4], 1: [1, 5], 2: [2, 6], 3: [3, 7], 4: [0, 4], 5: [1, 5], 6: [2, 6], 7: [3, 7]}


def test_case4_dp_tp_ep_numbers_match_reference(fully_shard_run8):
    assert_numbers(fully_shard_run8.case("c4_dp_tp_ep"), "ours-ref")


def test_case4_dp_tp_ep_unshard_changes_only_the_fsdp_dim(fully_shard_run8):
    """Experts [4, 32, 32] on (ep, etp) = (Shard(0), Shard(2)), fully_shard on (dp_replicate, efsdp):
    sharded (R, S(1), S(0), S(2)) -> unsharded (R, R, S(0), S(2)); ep / etp never change. Dense
    block on fsdp=4, experts on efsdp=2: RS / AG each on its own group, no all-reduce."""
    results = fully_shard_run8.case("c4_dp_tp_ep")
    for rank, result in results.items():
        experts = [e for e in result["placements"] if e["param"] == "experts.weight"]
        assert len(experts) == 8  # per step: unshard + reshard in forward and in backward
        for event in experts:
            assert event["mesh_dims"] == ["dp_replicate", "efsdp", "ep", "etp"]
            before, after = split_placements(event["before"]), split_placements(event["after"])
            sharded, unsharded = (before, after) if before[1] != "R" else (after, before)
            assert sharded == ["R", "S(1)", "S(0)", "S(2)"] and unsharded == ["R", "R", "S(0)", "S(2)"], event
        for event in result["placements"]:  # every parameter: only the FSDP entry changes
            before, after = split_placements(event["before"]), split_placements(event["after"])
            changed = [i for i, (b, a) in enumerate(zip(before, after)) if b != a]
            fsdp_index = 1
            assert changed == [fsdp_index], event
        fact = result["facts"]["params"]["experts.weight"]
        assert (fact["shape"], fact["local_shape"], fact["placements"]) == (
            [4, 32, 32],
            [2, 16, 16],
            "(R, S(1), S(0), S(2))",
        )
        assert (fact["shard_size"], fact["dp_size"], fact["rank_size"]) == (2, 1, 2)
        assert (fact["sharded"]["name"], fact["sharded"]["ranks"]) == ("efsdp", EP_EFSDP[rank])
        assert (fact["unsharded"]["name"], fact["unsharded"]["ranks"]) == ("dp_replicate", [rank])

    def expected(rank, step):
        g, eg = EP_FSDP[rank], EP_EFSDP[rank]
        return (
            fsdp_unit("root", "fsdp", g, ROOT_S4, root=True)
            + fsdp_unit("block", "fsdp", g, BLOCK_TP2_S4)
            + fsdp_unit("experts", "efsdp", eg, EXPERTS_S2)
        )

    assert_collectives(results, expected)


# ================================================================== gradient clipping over two meshes (8 ranks)


def test_clip_grad_norm_over_the_two_meshes_of_tp_and_fully_shard_equals_one_process(fully_shard_run8):
    """The total norm (2 and inf) and the clipped gradients equal torch's clip_grad_norm_ on the
    single-process model; torch's own clip_grad_norm_ cannot stack the two meshes' norms."""
    results = fully_shard_run8.case("clip_grad_norm_over_two_meshes")
    for rank, result in results.items():
        assert result["facts"]["grad_meshes"] == [["dp_replicate", "fsdp"], ["dp_replicate", "fsdp", "tp"]]
        assert "same mesh" in result["facts"]["torch_clip"], result["facts"]["torch_clip"]
        for label in ("norm_2", "clipped_2", "norm_inf", "clipped_inf"):
            entry = result["numbers"][f"{label}:ours-ref"]
            assert entry["ratio"] <= 1.0, (rank, label, entry["worst"], entry["max_abs"])
