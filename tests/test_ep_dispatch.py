"""Expert parallelism (hyper_parallel.parallel.ep) against the unsplit MoE, numbers and communication.

One torchrun launch per world size (2 and 4 ranks, started concurrently to save wall time) runs every
case of tests/workers/ep_cases.py; the tests below read its per-rank results. A few single-process
tests of the reference MoE and the permutation helper run without workers.
"""
from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from hyper_parallel.models.moe import MoE, MoEConfig, Router, expert_mlp
from hyper_parallel.parallel.ep import expert_major_order

WORKER = Path(__file__).parent / "workers" / "ep_cases.py"
TOLERANCE = 1e-5
B, S, D = 2, 4, 8  # batch, seq_len, d_model of the worker

# ----- hand-derived expectations -----------------------------------------------------------------
# (world, case) -> degrees-derived facts: dp (number of distinct token sets), top_k, num_experts, and per rank its ep
# group, etp group and token-split (tp) group. Sparse view (dp_replicate, efsdp, ep[, etp]) with TP
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
    (4, "ep4_top2"): dict(dp=4, k=2, E=8, ep=lambda r: ALL4, dead=[5]),
    (4, "ep4_top1_no_shared"): dict(dp=4, k=1, E=4, ep=lambda r: ALL4),
    (4, "ep2_etp2_top2"): dict(dp=2, k=2, E=4, ep=CROSS.get, etp=PAIRS.get),
    (4, "ep2_etp2_top1_dead_expert"): dict(dp=2, k=1, E=4, ep=CROSS.get, etp=PAIRS.get, dead=[1]),
    (4, "ep4_tp2_split_top2"): dict(dp=2, k=2, E=4, ep=lambda r: ALL4, split=PAIRS.get),
    (4, "ep4_tp2_nosplit_duplicates"): dict(dp=2, k=2, E=4, ep=lambda r: ALL4),
}


def expected_collectives(case: dict, rank: int) -> dict[str, list[tuple]]:
    """Per MoE layer, in issue order: (op, group, ranks, dtype)."""
    ep = ("all_to_all", "ep", case["ep"](rank))
    counts, tokens = ep + ("int64",), ep + ("float32",)
    etp = [("all_reduce", "etp", case["etp"](rank), "float32")] if "etp" in case else []
    split = [("all_gather", "tp", case["split"](rank), "float32")] if "split" in case else []
    return {
        # counts, dispatch, [etp partial-output sum], combine, [token-split gather of the outputs]
        "forward": [counts, tokens] + etp + [tokens] + split,
        # reverse of combine, [etp sum of the colwise input grad], reverse of dispatch, [input-grad gather]
        "backward": [tokens] + etp + [tokens] + split,
    }


# ----- the launches ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from launch.torchrun import torchrun

    def launch(world: int):
        run_dir = tmp_path_factory.mktemp(f"ep{world}")
        result = torchrun(str(WORKER), world, timeout=150, run_dir=run_dir)
        assert result.ok, result.error
        return {rank: json.loads((run_dir / f"ep_rank{rank}.json").read_text()) for rank in range(world)}

    with ThreadPoolExecutor(2) as pool:
        two, four = pool.submit(launch, 2), pool.submit(launch, 4)
        return {2: two.result(), 4: four.result()}


def _case(runs, world: int, name: str) -> dict[int, dict]:
    return {rank: per_rank[name] for rank, per_rank in runs[world].items()}


# ----- numbers --------------------------------------------------------------------------------------
@pytest.mark.distributed
@pytest.mark.parametrize("world,name", list(CASES))
def test_matches_unsplit_moe(runs, world, name):
    ranks = _case(runs, world, name)
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
    assert sum(counts) == facts["dp"] * B * S * facts["k"]  # the reference routed every distinct token
    assert [e for e, c in enumerate(counts) if c == 0] == facts.get("dead", [])


@pytest.mark.distributed
def test_shard_shapes(runs):
    """ep=2 on 4 experts: 2 local experts; ETP additionally halves the hidden dim (16 -> 8)."""
    assert _case(runs, 2, "ep2_top2")[1]["local_shapes"] == {"w1": [2, 8, 16], "w2": [2, 16, 8]}
    assert _case(runs, 4, "ep4_top2")[3]["local_shapes"] == {"w1": [2, 8, 16], "w2": [2, 16, 8]}
    assert _case(runs, 4, "ep2_etp2_top2")[2]["local_shapes"] == {"w1": [2, 8, 8], "w2": [2, 8, 8]}


@pytest.mark.distributed
def test_without_token_split_duplicated_tp_tokens_double_the_expert_grads(runs):
    """The worker compares this case against 2x the reference expert gradients (and passes)."""
    for result in _case(runs, 4, "ep4_tp2_nosplit_duplicates").values():
        assert result["errors"]["experts.w1"] <= TOLERANCE and result["errors"]["experts.w2"] <= TOLERANCE


# ----- communication --------------------------------------------------------------------------------
@pytest.mark.distributed
@pytest.mark.parametrize("world,name", list(CASES))
def test_collectives_per_layer(runs, world, name):
    facts = CASES[world, name]
    ranks = _case(runs, world, name)
    for rank, result in ranks.items():
        seen = {phase: [(op, group, ranks_, dtype) for ph, op, group, ranks_, dtype, _ in result["events"] if ph == phase]
                for phase in ("forward", "backward")}
        assert seen == expected_collectives(facts, rank), f"rank {rank}"
        assert len(result["events"]) == len(seen["forward"]) + len(seen["backward"])
        forward = [e for e in result["events"] if e[0] == "forward"]
        assert forward[0][5] == 8 * facts["E"]  # the counts: one int64 per global expert
        split = len(facts["split"](rank)) if "split" in facts else 1
        assert forward[1][5] == B * S // split * facts["k"] * D * 4  # dispatch sends all of this rank's slots
    # what the combines send back (the received rows) adds up to what the dispatches sent
    dispatched = sum(r["events"][1][5] for r in ranks.values())
    combine_index = 3 if "etp" in facts else 2
    combined = sum(r["events"][combine_index][5] for r in ranks.values())
    assert combined == dispatched


@pytest.mark.distributed
def test_idle_rank_exchanges_empty_buffers(runs):
    """Experts 2 and 3 (ep rank 1) never win: rank 1 receives no rows, so its combine sends 0 bytes
    and its backward dispatch-reverse too; gloo handles the zero-size all_to_all."""
    ranks = _case(runs, 2, "ep2_top1_idle_rank")
    assert ranks[1]["events"][2][1:] == ["all_to_all", "ep", [0, 1], "float32", 0]
    assert ranks[0]["events"][2][5] == 2 * B * S * D * 4  # rank 0 returns both ranks' rows
    assert ranks[1]["expert_ref_grad_max"] == 0.0  # its experts' reference grads are zero, and so are its own


@pytest.mark.distributed
def test_invalid_uses_raise_clear_errors(runs):
    two, four = runs[2][0]["invalid_uses"], runs[4][0]["invalid_uses"]
    assert "num_experts=3 must be divisible by ep=2" in two["experts_not_divisible"]
    assert "('ep',) or ('ep', 'etp')" in two["wrong_mesh"] and "dp_shard" in two["wrong_mesh"]
    assert "already parallelized" in two["twice"]
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
    expected = torch.stack([
        sum(weights[t, j] * expert_mlp(tokens[t], moe.experts.w1[indices[t, j]], moe.experts.w2[indices[t, j]])
            for j in range(top_k)) for t in range(10)])
    if shared:
        expected = expected + moe.shared(tokens)
    assert torch.allclose(moe(x).reshape(-1, 8), expected, atol=1e-6)
    names = [name for name, _ in moe.named_parameters()]
    assert names == ["router.gate.weight", "experts.w1", "experts.w2"] + (
        ["shared.w1.weight", "shared.w2.weight"] if shared else [])


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
