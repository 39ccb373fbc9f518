"""Expert parallelism (hyper_parallel.parallel.ep) against the unsplit MoE, numbers and communication.

One torchrun launch per world size (2 and 4 ranks, started concurrently to save wall time) runs every
case of tests/workers/ep_cases.py with both token dispatchers (``dispatch="all_to_all"`` and
``"all_gather"``); the tests below read its per-rank results. A few single-process tests of the
reference MoE and the permutation helpers run without workers.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from hyper_parallel.models.moe import MoE, MoEConfig, Router, expert_mlp
from hyper_parallel.parallel.ep import expert_major_order
from hyper_parallel.parallel.ep.all_gather import local_rows

WORKER = Path(__file__).parent / "workers" / "ep_cases.py"
TOLERANCE = 1e-5
SAME_AS_ALL_TO_ALL = 1e-6  # the all-gather path against the all-to-all path (same rows, same order)
DISPATCHES = ("all_to_all", "all_gather")
B, S, D = 2, 4, 8  # batch, seq_len, d_model of the worker

# ----- hand-derived expectations -----------------------------------------------------------------
# (world, case) -> degrees-derived facts: dp (number of distinct token sets), top_k, num_experts, and per rank its ep
# group, etp group and token-split (tp) group; seq: tokens per sequence of each data coordinate (== rank
# in the dp_shard-only cases) when they differ. Sparse view (dp_replicate, efsdp, ep[, etp]) with TP
# innermost: for (dp_shard=2, tp=2, ep=2, etp=2) the etp groups are the tp pairs {0,1},{2,3} and the
# ep groups take one rank of each pair: {0,2},{1,3}. With etp=1 EP borrows tp: (dp_shard=2, tp=2,
# ep=4) has one ep group {0,1,2,3} containing the tp pairs, which hold the same tokens.
ALL2, ALL4 = [0, 1], [0, 1, 2, 3]
PAIRS = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
CROSS = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
CASES = {
    (2, "ep2_top1"): dict(dp=2, k=1, E=4, ep=lambda r: ALL2),
    (2, "ep2_top2"): dict(dp=2, k=2, E=4, ep=lambda r: ALL2),
    (2, "ep2_top2_dead_expert"): dict(dp=2, k=2, E=4, ep=lambda r: ALL2, dead=[3]),
    (2, "ep2_top1_idle_rank"): dict(dp=2, k=1, E=4, ep=lambda r: ALL2, dead=[2, 3]),
    (2, "ep2_tp2_split_top2"): dict(dp=1, k=2, E=4, ep=lambda r: ALL2, split=lambda r: ALL2),
    (2, "ep2_top2_uneven_tokens"): dict(dp=2, k=2, E=4, ep=lambda r: ALL2, seq=[4, 1]),
    (4, "ep4_top2"): dict(dp=4, k=2, E=8, ep=lambda r: ALL4, dead=[5]),
    (4, "ep4_top1_no_shared"): dict(dp=4, k=1, E=4, ep=lambda r: ALL4),
    (4, "ep2_etp2_top2"): dict(dp=2, k=2, E=4, ep=CROSS.get, etp=PAIRS.get),
    (4, "ep2_etp2_top1_dead_expert"): dict(dp=2, k=1, E=4, ep=CROSS.get, etp=PAIRS.get, dead=[1]),
    (4, "ep4_tp2_split_top2"): dict(dp=2, k=2, E=4, ep=lambda r: ALL4, split=PAIRS.get),
    (4, "ep4_tp2_nosplit_duplicates"): dict(dp=2, k=2, E=4, ep=lambda r: ALL4),
    (4, "ep4_top2_uneven_empty_rank"): dict(dp=4, k=2, E=4, ep=lambda r: ALL4, seq=[4, 2, 0, 3]),
}


def routed_rows(case: dict, rank: int) -> int:
    """Rows ``rank`` routes per layer: its tokens (after the token split) x top_k."""
    split = len(case["split"](rank)) if "split" in case else 1
    return B * case.get("seq", [S] * 4)[rank] // split * case["k"]


def expected_collectives(case: dict, rank: int, dispatch: str) -> dict[str, list[tuple]]:
    """Per MoE layer, in issue order: (op, group, ranks, dtype) (ep.py's module docstring)."""
    ep = case["ep"](rank)
    etp = [("all_reduce", "etp", case["etp"](rank), "float32")] if "etp" in case else []
    split = [("all_gather", "tp", case["split"](rank), "float32")] if "split" in case else []
    if dispatch == "all_to_all":
        counts, tokens = ("all_to_all", "ep", ep, "int64"), ("all_to_all", "ep", ep, "float32")
        return {
            # counts, dispatch, [etp partial-output sum], combine, [token-split gather of the outputs]
            "forward": [counts, tokens] + etp + [tokens] + split,
            # reverse of combine, [etp sum of the colwise input grad], reverse of dispatch, [input-grad gather]
            "backward": [tokens] + etp + [tokens] + split,
        }
    counts = ("all_gather", "ep", ep, "int64")
    gather, scatter = ("all_gather", "ep", ep, "float32"), ("reduce_scatter", "ep", ep, "float32")
    return {
        # counts, rows (AllGatherDispatch), [etp partial-output sum], outputs (ReduceScatterCombine), [split]
        "forward": [counts, gather] + etp + [scatter] + split,
        # output grads (adjoint of the reduce_scatter), [etp sum of the colwise input grad],
        # input grads (adjoint of the dispatch all_gather), [input-grad gather]
        "backward": [gather] + etp + [scatter] + split,
    }


# ----- the launches ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from launch.processes.supervisor import torchrun

    run_dirs = {world: tmp_path_factory.mktemp(f"ep{world}") for world in (2, 4)}  # not in the threads

    def launch(world: int):
        run_dir = run_dirs[world]
        result = torchrun(str(WORKER), world, timeout=150, run_dir=run_dir)
        assert result.ok, result.error
        return {rank: json.loads((run_dir / f"ep_rank{rank}.json").read_text()) for rank in range(world)}

    with ThreadPoolExecutor(2) as pool:
        two, four = pool.submit(launch, 2), pool.submit(launch, 4)
        return {2: two.result(), 4: four.result()}


def _case(runs, world: int, name: str, dispatch: str | None = "all_to_all") -> dict[int, dict]:
    """Per rank: the results of one dispatch (``None``: both, and their comparison)."""
    return {
        rank: per_rank[name] if dispatch is None else per_rank[name][dispatch] for rank, per_rank in runs[world].items()
    }


def _seen(result: dict) -> dict[str, list[tuple]]:
    return {
        phase: [(op, group, ranks_, dtype) for ph, op, group, ranks_, dtype, _ in result["events"] if ph == phase]
        for phase in ("forward", "backward")
    }


# ----- numbers --------------------------------------------------------------------------------------
@pytest.mark.distributed
@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("world,name", list(CASES))
def test_matches_unsplit_moe(runs, world, name, dispatch):
    ranks = _case(runs, world, name, dispatch)
    for rank, result in ranks.items():
        errors = result["errors"]
        expected = {"output", "input_grad", "experts.w1", "experts.w2", "router.gate.weight"}
        assert expected <= set(errors)
        bad = {key: value for key, value in errors.items() if not value <= TOLERANCE}
        assert not bad, f"rank {rank}: {bad}"
    # the compared expert gradients are not trivially zero (except on an ep rank whose experts got no token)
    assert max(result["expert_ref_grad_max"] for result in ranks.values()) > 1e-3
    facts = CASES[world, name]
    counts = ranks[0]["tokens_per_expert"]
    assert sum(counts) == sum(facts.get("seq", [S] * facts["dp"])) * B * facts["k"]  # every distinct token
    assert {e for e, c in enumerate(counts) if c == 0} >= set(facts.get("dead", []))  # zero-token experts


@pytest.mark.distributed
def test_shard_shapes(runs):
    """ep=2 on 4 experts: 2 local experts; ETP additionally halves the hidden dim (16 -> 8)."""
    assert _case(runs, 2, "ep2_top2")[1]["local_shapes"] == {"w1": [2, 8, 16], "w2": [2, 16, 8]}
    assert _case(runs, 4, "ep4_top2")[3]["local_shapes"] == {"w1": [2, 8, 16], "w2": [2, 16, 8]}
    assert _case(runs, 4, "ep2_etp2_top2")[2]["local_shapes"] == {"w1": [2, 8, 8], "w2": [2, 8, 8]}


@pytest.mark.distributed
def test_without_token_split_duplicated_tp_tokens_double_the_expert_grads(runs):
    """Why token_split_mesh exists: the worker compares this case against 2x the reference expert
    gradients (passes) and the plain reference is far off."""
    for result in _case(runs, 4, "ep4_tp2_nosplit_duplicates").values():
        assert result["errors"]["experts.w1"] <= TOLERANCE and result["errors"]["experts.w2"] <= TOLERANCE
        assert result["unscaled_expert_w1_error"] > 1e-3


@pytest.mark.distributed
@pytest.mark.parametrize("world,name", list(CASES))
def test_all_gather_path_equals_all_to_all_path(runs, world, name):
    """Same parameters (names, DTensor placements, local shards) and the same outputs, input gradients
    and parameter gradients on every rank (the same rows reach each expert in the same order)."""
    for rank, result in _case(runs, world, name, None).items():
        a2a, ag = result["all_to_all"], result["all_gather"]
        assert a2a["experts_class"] == "ExpertParallelExperts"
        assert ag["experts_class"] == "AllGatherExpertParallelExperts"
        assert ag["parameters"] == a2a["parameters"] and ag["local_shapes"] == a2a["local_shapes"]
        diffs = result["all_gather_vs_all_to_all"]
        assert set(diffs) == {"output", "input_grad"} | set(a2a["parameters"])
        bad = {key: value for key, value in diffs.items() if not value <= SAME_AS_ALL_TO_ALL}
        assert not bad, f"rank {rank}: {bad}"


# ----- communication --------------------------------------------------------------------------------
@pytest.mark.distributed
@pytest.mark.parametrize("world,name", list(CASES))
def test_collectives_per_layer(runs, world, name):
    facts = CASES[world, name]
    ranks = _case(runs, world, name)
    for rank, result in ranks.items():
        seen = _seen(result)
        assert seen == expected_collectives(facts, rank, "all_to_all"), f"rank {rank}"
        assert len(result["events"]) == len(seen["forward"]) + len(seen["backward"])
        forward = [e for e in result["events"] if e[0] == "forward"]
        assert forward[0][5] == 8 * facts["E"]  # the counts: one int64 per global expert
        assert forward[1][5] == routed_rows(facts, rank) * D * 4  # dispatch sends all of this rank's slots
    # what the combines send back (the received rows) adds up to what the dispatches sent
    dispatched = sum(r["events"][1][5] for r in ranks.values())
    combine_index = 3 if "etp" in facts else 2
    combined = sum(r["events"][combine_index][5] for r in ranks.values())
    assert combined == dispatched


@pytest.mark.distributed
@pytest.mark.parametrize("world,name", list(CASES))
def test_all_gather_collectives_per_layer(runs, world, name):
    """No all_to_all; counts gathered as int64 [ep, E]; the four row collectives (forward all_gather
    and reduce_scatter, their adjoints in backward) all move ep x capacity rows, capacity = the largest
    routed-row count of the ep group (uneven groups pad to it)."""
    facts = CASES[world, name]
    for rank, result in _case(runs, world, name, "all_gather").items():
        seen = _seen(result)
        assert seen == expected_collectives(facts, rank, "all_gather"), f"rank {rank}"
        assert len(result["events"]) == len(seen["forward"]) + len(seen["backward"])
        assert not [e for e in result["events"] if e[1] == "all_to_all"]
        ep = facts["ep"](rank)
        capacity = max(routed_rows(facts, r) for r in ep)
        on_ep = [e for e in result["events"] if e[2] == "ep"]
        assert on_ep[0][4:] == ["int64", len(ep) * facts["E"] * 8]
        assert [e[5] for e in on_ep[1:]] == [len(ep) * capacity * D * 4] * 4, f"rank {rank}"


@pytest.mark.distributed
def test_idle_rank_exchanges_empty_buffers(runs):
    """Experts 2 and 3 (ep rank 1) never win: rank 1 receives no rows, so its combine sends 0 bytes
    and its backward dispatch-reverse too; gloo handles the zero-size all_to_all."""
    ranks = _case(runs, 2, "ep2_top1_idle_rank")
    assert ranks[1]["events"][2][1:] == ["all_to_all", "ep", [0, 1], "float32", 0]
    assert ranks[0]["events"][2][5] == 2 * B * S * D * 4  # rank 0 returns both ranks' rows
    assert ranks[1]["expert_ref_grad_max"] == 0.0  # its experts' reference grads are zero, and so are its own
    # the all-gather dispatcher moves full buffers regardless: both ranks gather and reduce-scatter 2 x 8 rows
    for result in _case(runs, 2, "ep2_top1_idle_rank", "all_gather").values():
        assert [e[5] for e in result["events"] if e[4] == "float32"] == [2 * B * S * D * 4] * 4


@pytest.mark.distributed
def test_invalid_uses_raise_clear_errors(runs):
    two, four = runs[2][0]["invalid_uses"], runs[4][0]["invalid_uses"]
    assert "num_experts=3 must be divisible by ep=2" in two["experts_not_divisible"]
    assert "('ep',) or ('ep', 'etp')" in two["wrong_mesh"] and "dp_shard" in two["wrong_mesh"]
    assert "unknown dispatch='alltoall'; choose one of 'all_to_all', 'all_gather'" in two["unknown_dispatch"]
    assert "parallelize_moe already applied" in two["twice"]
    assert "seq_len=3 must be divisible by the token-split group tp=2" in two["seq_not_divisible"]
    assert "hidden size 15 must be divisible by etp=2" in four["hidden_not_divisible"]
    assert "token_split_mesh is for etp == 1" in four["split_with_etp"]


# ----- single process -------------------------------------------------------------------------------
@pytest.mark.parametrize("top_k,shared", [(1, False), (2, True), (3, True)])
def test_reference_moe_is_the_weighted_sum_of_its_experts(top_k, shared):
    torch.manual_seed(0)
    moe = MoE(MoEConfig(d_model=8, hidden=16, num_experts=4, top_k=top_k, shared_expert=shared))
    x = torch.randn(2, 5, 8)
    tokens = x.reshape(-1, 8)
    weights, indices = moe.router(tokens)
    assert torch.allclose(weights.sum(-1), torch.ones(10))
    expected = torch.stack(
        [
            sum(
                weights[t, j] * expert_mlp(tokens[t], moe.experts.w1[indices[t, j]], moe.experts.w2[indices[t, j]])
                for j in range(top_k)
            )
            for t in range(10)
        ]
    )
    if shared:
        expected = expected + moe.shared(tokens)
    assert torch.allclose(moe(x).reshape(-1, 8), expected, atol=1e-6)
    names = [name for name, _ in moe.named_parameters()]
    assert names == ["router.gate.weight", "experts.w1", "experts.w2"] + (
        ["shared.w1.weight", "shared.w2.weight"] if shared else []
    )


def test_same_seed_builds_the_same_moe():
    config = MoEConfig()
    torch.manual_seed(3)
    first = MoE(config).state_dict()
    torch.manual_seed(3)
    second = MoE(config).state_dict()
    assert all(torch.equal(first[key], second[key]) for key in first)


def test_router_ties_go_to_the_lower_expert():
    router = Router(d_model=2, num_experts=4, top_k=2)
    with torch.no_grad():
        router.gate.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    weights, indices = router(torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 2.0]]))
    assert indices.tolist() == [[0, 1], [1, 2], [0, 3]]
    assert torch.allclose(weights, torch.full((3, 2), 0.5))


def test_expert_major_order_regroups_received_rows():
    # 2 source ranks x 2 local experts; rows arrive as (src0: e0 x2, e1 x1), (src1: e0 x0, e1 x3)
    received_counts = torch.tensor([[2, 1], [0, 3]])
    order = expert_major_order(received_counts)
    assert order.tolist() == [0, 1, 2, 3, 4, 5]
    received_counts = torch.tensor([[1, 2], [2, 0]])  # rows: s0e0 | s0e1 s0e1 | s1e0 s1e0
    assert expert_major_order(received_counts).tolist() == [0, 3, 4, 1, 2]
    assert expert_major_order(torch.zeros(2, 2, dtype=torch.long)).tolist() == []


def test_local_rows_selects_this_ranks_experts_expert_major():
    # ep=2, E=4, capacity 4. Source 0 routes e0 x2, e1 x1, e3 x1 (gathered rows 0..3); source 1 (padded,
    # rows from 4) e1 x3, e2 x1 -> rows 4, 5, 6 | 7.
    all_counts = torch.tensor([[2, 1, 0, 1], [0, 3, 1, 0]])
    assert local_rows(all_counts, first=0, local=2, capacity=4).tolist() == [0, 1, 2, 4, 5, 6]  # e0 | e1: s0, s1
    assert local_rows(all_counts, first=2, local=2, capacity=4).tolist() == [7, 3]  # e2: s1 | e3: s0
    assert local_rows(torch.zeros(2, 4, dtype=torch.long), first=0, local=2, capacity=0).tolist() == []
