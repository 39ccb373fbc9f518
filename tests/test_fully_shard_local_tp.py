"""fully_shard over local-tensor TP+SP (docs/design.md §3, cases 5, 6 and 7, and regressions this suite
found; worker tests/workers/fully_shard_local_tp_cases.py): pure TP with enable_param_shard=False (with
and without marking partial gradients), a tp-only and a (dp_replicate, tp) mesh where sharding is
inferred off, and the full (dp_replicate, fsdp, tp) mesh where it stays on; each checked against the
single-process reference (numbers, and equal tp replicas) and the hand-derived activation and gradient
collectives and GroupInfo of tests/fully_shard_expectations.py.
"""

from __future__ import annotations

import pytest
from fully_shard_expectations import (
    ALL_NAMES,
    ANY,
    BLOCK_NAMES,
    BLOCK_TP2_S2,
    MESH8_FSDP,
    MESH8_REP,
    MESH8_TP,
    ROOT_PARAMS,
    ROOT_S2,
    ar,
    assert_collectives,
    assert_group_facts,
    assert_numbers,
    fsdp_unit,
    ratios,
    sp_activations,
)

pytestmark = pytest.mark.distributed

# ================================================================== case 5: pure TP + enable_param_shard=False

# ParallelDims(4, dp_shard=2, tp=2): rank = 2 * fsdp + tp
PTP_DP = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
PTP_TP = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
PARTIAL = ("norm.weight", "w2.bias")  # replicated over tp, but each tp rank saw only its sequence chunk


def _pure_tp_expected(fixed: bool, scatter_adjoint_module: str = ANY):
    def expected(rank, step):
        dp, tp = PTP_DP[rank], PTP_TP[rank]
        events = sp_activations(tp, 4 * 8 * 32 * 4, scatter_adjoint_module)  # 4 rows per dp rank
        events.append(ar("root", "dp_replicate+fsdp", dp, ROOT_S2))  # whole unit, no RS, no AG
        for block in ("blocks.0", "blocks.1"):
            events.append(ar(block, "dp_replicate+fsdp", dp, BLOCK_TP2_S2))
            if fixed:
                events.append(ar(block, "tp", tp, (32 + 32) * 4))  # norm.weight + w2.bias summed over tp
        return events

    return expected


def test_case5_pure_tp_all_reduce_on_unsharded_dp_group_no_reduce_scatter(fully_shard_run4):
    results = fully_shard_run4.case("c5_pure_tp_fixed")
    assert_collectives(results, _pure_tp_expected(fixed=True))
    # the pure-TP example "rank_size 8, shard 1, dp 8 -> AR(8) only"; here rank 2, shard 1, dp 2
    assert_group_facts(
        results,
        ALL_NAMES,
        shard_size=1,
        dp_size=2,
        rank_size=2,
        sharded={r: ("", [r]) for r in range(4)},
        unsharded={r: ("dp_replicate+fsdp", PTP_DP[r]) for r in range(4)},
    )


def test_case5_pure_tp_fix_matches_reference_and_keeps_replicas_equal(fully_shard_run4):
    results = fully_shard_run4.case("c5_pure_tp_fixed")
    assert_numbers(results, "ours-ref")
    for rank, result in results.items():
        for step, spread in result["facts"]["replica_spread"].items():
            assert spread and all(v == 0.0 for v in spread.values()), (rank, step, spread)


def test_case5_without_the_fix_gradients_are_wrong_and_replicas_diverge(fully_shard_run4):
    """The same run without marking partial gradients: the norm weight and w2 bias gradients differ
    from the reference (each tp rank keeps the sum over its own sequence chunk), every other gradient
    of step 0 is right; after one step the tp replicas of those weights differ."""
    results = fully_shard_run4.case("c5_pure_tp_unfixed")
    assert_collectives(results, _pure_tp_expected(fixed=False))
    partial = {f"blocks.{b}.{p}" for b in (0, 1) for p in PARTIAL}
    for rank, result in results.items():
        grads = ratios(result, "grad0:ours-ref")
        wrong = {name for name, ratio in grads.items() if ratio > 1.0}
        assert wrong == partial, (rank, sorted(wrong))
        spread = result["facts"]["replica_spread"]["0"]
        assert {name for name, value in spread.items() if value > 0} == partial, (rank, spread)
        assert ratios(result, "param1:ours-ref")["blocks.0.norm.weight"] > 1.0


# ================================================================== case 6: pure TP + None

TP4 = {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3], 3: [0, 1, 2, 3]}
# ParallelDims(4, dp_replicate=2, tp=2): rank = 2 * dp_replicate + tp
REP_TP_REP = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
REP_TP_TP = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}


def test_case6_pure_tp_tp_mesh_alone_disables_sharding_by_inference(fully_shard_run4):
    """Every unit with mesh=views["tp"] (4 ranks, no data-parallel dim), enable_param_shard=None:
    shard 1, dp 1, rank 1; fully_shard's only collective is the partial-gradient AR over tp
    [0, 1, 2, 3]. The root's plain inp / head weights compute as plain tensors."""
    results = fully_shard_run4.case("c6_tp_only")
    assert_numbers(results, "ours-ref")
    one = {r: ("", [r]) for r in range(4)}
    assert_group_facts(results, ALL_NAMES, shard_size=1, dp_size=1, rank_size=1, sharded=one, unsharded=one)

    def expected(rank, step):
        events = sp_activations(TP4[rank], 8 * 8 * 32 * 4)  # dp = 1: every rank has the 8 rows
        return events + [ar(block, "tp", TP4[rank], (32 + 32) * 4) for block in ("blocks.0", "blocks.1")]

    assert_collectives(results, expected)


def test_case6_pure_tp_dp_replicate_tp_mesh_all_reduce_only(fully_shard_run4):
    """Every unit with mesh (dp_replicate=2, tp=2), enable_param_shard=None: no shard dim -> shard 1,
    dp 2, rank 2: AR of the whole unit on dp_replicate [0,2] | [1,3], no RS / AG."""
    results = fully_shard_run4.case("c6_dp_replicate_tp")
    assert_numbers(results, "ours-ref")
    assert_group_facts(
        results,
        BLOCK_NAMES + list(ROOT_PARAMS),
        shard_size=1,
        dp_size=2,
        rank_size=2,
        sharded={r: ("", [r]) for r in range(4)},
        unsharded={r: ("dp_replicate", REP_TP_REP[r]) for r in range(4)},
    )

    def expected(rank, step):
        rep, tp = REP_TP_REP[rank], REP_TP_TP[rank]
        events = sp_activations(tp, 4 * 8 * 32 * 4) + [ar("root", "dp_replicate", rep, ROOT_S2)]
        for block in ("blocks.0", "blocks.1"):
            events += [ar(block, "dp_replicate", rep, BLOCK_TP2_S2), ar(block, "tp", tp, (32 + 32) * 4)]
        return events

    assert_collectives(results, expected)


# ================================================================== case 7: full mesh + None


def test_case7_full_mesh_is_not_mistaken_for_pure_tp(fully_shard_run8):
    """Every unit on (dp_replicate=2, fsdp=2, tp=2) with enable_param_shard=None: shard 2 (fsdp), dp 2,
    rank 4: AG + RS on fsdp, AR of the shard on dp_replicate, partial AR of the shard over tp."""
    results = fully_shard_run8.case("c7_full_mesh")
    assert_numbers(results, "ours-ref")
    assert_group_facts(
        results,
        BLOCK_NAMES + list(ROOT_PARAMS),
        shard_size=2,
        dp_size=2,
        rank_size=4,
        sharded={r: ("fsdp", MESH8_FSDP[r]) for r in range(8)},
        unsharded={r: ("dp_replicate", MESH8_REP[r]) for r in range(8)},
    )
    for name in ("blocks.0.w1.weight", "inp.weight"):  # one layout per parameter on the full mesh
        assert results[0]["facts"]["params"][name]["mesh_dims"] == ["dp_replicate", "fsdp", "tp"]
    assert results[0]["facts"]["params"]["blocks.0.w1.weight"]["placements"] == "(R, S(1), S(0))"
    assert results[0]["facts"]["params"]["inp.weight"]["placements"] == "(R, S(0), R)"

    def expected(rank, step):
        g, rep, tp = MESH8_FSDP[rank], MESH8_REP[rank], MESH8_TP[rank]
        events = sp_activations(tp, 2 * 8 * 32 * 4)  # dp = 4: 2 rows per rank
        events += fsdp_unit(
            "root", "fsdp", g, ROOT_S2, root=True, ar_group="dp_replicate", ar_ranks=rep, ar_bytes=ROOT_S2 // 2
        )
        for block in ("blocks.0", "blocks.1"):
            events += fsdp_unit(
                block, "fsdp", g, BLOCK_TP2_S2, ar_group="dp_replicate", ar_ranks=rep, ar_bytes=BLOCK_TP2_S2 // 2
            )
            events.append(ar(block, "tp", tp, (32 + 32) // 2 * 4))  # this rank's shard of norm.weight + w2.bias
        return events

    assert_collectives(results, expected)


def test_case7_full_mesh_4_ranks_same_layout_as_case5_shards(fully_shard_run4):
    """Case 5's layout (fsdp=2, tp=2) but the full mesh and None: RS on fsdp instead of AR; dp 1."""
    results = fully_shard_run4.case("c7_full_mesh_4")
    assert_numbers(results, "ours-ref")
    assert_group_facts(
        results,
        ALL_NAMES,
        shard_size=2,
        dp_size=1,
        rank_size=2,
        sharded={r: ("fsdp", PTP_DP[r]) for r in range(4)},
        unsharded={r: ("dp_replicate", [r]) for r in range(4)},
    )

    def expected(rank, step):
        g, tp = PTP_DP[rank], PTP_TP[rank]
        events = sp_activations(tp, 4 * 8 * 32 * 4) + fsdp_unit("root", "fsdp", g, ROOT_S2, root=True)
        for block in ("blocks.0", "blocks.1"):
            events += fsdp_unit(block, "fsdp", g, BLOCK_TP2_S2) + [ar(block, "tp", tp, (32 + 32) // 2 * 4)]
        return events

    assert_collectives(results, expected)


# ================================================================== regressions of bugs this suite found


def test_trace_labels_the_roots_backward_activation_collective_with_root(fully_shard_run4):
    """Regression: once a unit's gradients are reduced, the label returns to the enclosing unit."""
    results = fully_shard_run4.case("c5_pure_tp_fixed")
    assert_collectives(
        results, lambda rank, step: _pure_tp_expected(fixed=True, scatter_adjoint_module="root")(rank, step)
    )


def test_fully_shard_accepts_tp_params_after_the_mesh_was_rebuilt(fully_shard_run4):
    """Regression for a bug this suite found (api._combined_mesh compared root meshes with ``is``):
    after the same views were built twice in one process, DTensor's sharding-propagation cache (keyed
    on DeviceMesh equality) gives TP parameters of the second build the first build's mesh object;
    fully_shard raised "do not share a root mesh". Now compared by value, as torch's _concatenate."""
    results = fully_shard_run4.case("rebuilt_mesh")
    for rank, result in results.items():  # the situation still arises (else this test tests nothing)
        assert result["facts"]["tp_param_mesh_is_second_build"] is False, rank
    assert_numbers(results, "ours-ref", steps=1)
