"""Context-parallel attention (hyper_parallel.parallel.cp: K/V all-gather and ring) and Ulysses
attention (hyper_parallel.parallel.ulysses: all-to-all to head shards and back) against the unsplit
computation.

One torchrun launch per world size (2 and 4 ranks) runs every case of
tests/workers/cp_attention_cases.py; the tests below assert on what each rank wrote. The layout
functions and the cp-of-one path need no process group and are tested in this process.
"""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hyper_parallel import trace
from hyper_parallel.comm import GroupInfo
from hyper_parallel.parallel.cp import (
    context_parallel_attention,
    load_balanced_positions,
    shard_sequence,
    unshard_sequence,
)
from hyper_parallel.parallel.ulysses import ulysses_attention
from launch.processes.supervisor import torchrun

WORKER = Path(__file__).parent / "workers" / "cp_attention_cases.py"
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}

# seq_len 16: chunks of 16 / (2*cp); rank i holds chunk i and chunk 2*cp-1-i
POSITIONS_16 = {
    2: [
        [0, 1, 2, 3, 12, 13, 14, 15],  # chunks 0 and 3
        [4, 5, 6, 7, 8, 9, 10, 11],
    ],  # chunks 1 and 2
    4: [
        [0, 1, 14, 15],  # chunks 0 and 7
        [2, 3, 12, 13],  # chunks 1 and 6
        [4, 5, 10, 11],  # chunks 2 and 5
        [6, 7, 8, 9],
    ],  # chunks 3 and 4
}


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def ranks(request, tmp_path_factory):
    """Every rank's results of one launch; parametrised by world size."""
    nproc = request.param
    run_dir = tmp_path_factory.mktemp(f"cp{nproc}")
    result = torchrun(str(WORKER), nproc, timeout=150, run_dir=run_dir)
    assert result.ok, result.error
    return [json.loads((run_dir / f"cp_rank{rank}.json").read_text()) for rank in range(nproc)]


def _cases(ranks):
    for rank in ranks:
        for layout, entry in rank["layouts"].items():
            for case in entry["cases"]:
                yield rank["rank"], layout, entry, case


@pytest.mark.distributed
def test_matches_unsplit_attention_forward_and_gradients(ranks):
    """Output and q/k/v gradients equal float64 SDPA on the full sequence (causal, non-causal, GQA; K/V
    all-gather, ring and Ulysses)."""
    worst = {}
    for rank, layout, _entry, case in _cases(ranks):
        assert case["out_dtype"] == case["dtype"]
        for name, err in case["errors"].items():
            label = f"rank {rank} {layout} {case['impl']} causal={case['causal']} {case['dtype']} kv_heads={case['kv_heads']} S={case['seq_len']} {name}"
            assert err <= TOLERANCE[case["dtype"]], f"{label}: max abs diff {err:.3e}"
            key = (case["impl"], case["dtype"])
            worst[key] = max(worst.get(key, 0.0), err)
    print("max abs diff vs unsplit float64 SDPA:", {f"{i}/{d}": f"{e:.2e}" for (i, d), e in worst.items()})


@pytest.mark.distributed
def test_transformer_with_cp_attention_core_matches_full_sequence(ranks):
    """attention_core(cp) in the mini transformer: loss and cp-summed parameter gradients equal the
    single-process model (float32 end to end, so a slightly looser bound)."""
    for rank in ranks:
        for layout, entry in rank["layouts"].items():
            errors = entry["transformer"]
            assert errors["loss"] <= 1e-5 and errors["param_grads"] <= 1e-5, (rank["rank"], layout, errors)
            errors = entry["transformer_ulysses"]
            assert errors["loss"] <= 1e-5 and errors["param_grads"] <= 1e-5, (rank["rank"], layout, "ulysses", errors)


@pytest.mark.distributed
def test_every_impl_ran_on_every_layout(ranks):
    """Ulysses runs where cp divides the K/V heads (4 heads: always; GQA's 2 K/V heads: cp <= 2), so a
    skipped case shows here rather than as a silently shorter list."""
    for rank in ranks:
        for layout, entry in rank["layouts"].items():
            cp_size = len(entry["cp_ranks"])
            ran = sorted((c["impl"], c["kv_heads"], c["causal"], c["dtype"]) for c in entry["cases"])
            ulysses = [
                ("ulysses", 4, False, "float32"),
                ("ulysses", 4, True, "float32"),
                ("ulysses", 4, True, "float64"),
            ]
            ulysses += [("ulysses", 2, True, "float32")] if cp_size <= 2 else []
            assert [c for c in ran if c[0] == "ulysses"] == sorted(ulysses), (rank["rank"], layout)
            assert len([c for c in ran if c[0] != "ulysses"]) == 8, (rank["rank"], layout)


@pytest.mark.distributed
def test_each_rank_holds_its_load_balanced_chunks(ranks):
    world = len(ranks)
    for rank in ranks:
        layouts = rank["layouts"]
        assert layouts["cp_all"]["cp_ranks"] == list(range(world))
        assert layouts["cp_all"]["positions_16"] == POSITIONS_16[world][rank["rank"]]
        assert layouts["cp1"]["positions_16"] == list(range(16))
        if world == 4:  # cp=2 x tp=2: cp is outside tp, so the cp groups are {0, 2} and {1, 3}
            entry = layouts["cp2_tp2"]
            assert entry["cp_ranks"] == [rank["rank"] % 2, rank["rank"] % 2 + 2]
            assert entry["positions_16"] == POSITIONS_16[2][rank["rank"] // 2]


@pytest.mark.distributed
def test_communication_per_attention_call(ranks):
    """all_gather impl: one all-gather of stacked K/V forward, one reduce-scatter backward, each of
    the full K+V bytes. ring: cp-1 all-to-all shifts of the local K/V block each way. unshard: one
    all-gather forward, nothing in backward. ulysses: forward one all-to-all of the stacked local q/k/v
    (3 local K bytes; GQA: q and stacked K/V, two calls) and one of the output (local q bytes),
    backward the same all-to-alls in reverse order. A cp group of one communicates nothing."""
    for rank, layout, entry, case in _cases(ranks):
        cp_ranks, cp_size = entry["cp_ranks"], len(entry["cp_ranks"])
        events = [(e["op"], e["phase"], e["module"], e["bytes"]) for e in case["events"]]
        where = f"rank {rank} {layout} {case['impl']} causal={case['causal']}"
        if cp_size == 1:
            assert events == [], where
            continue
        assert all(
            e["group"] == "cp" and e["ranks"] == cp_ranks and e["dtype"] == case["dtype"] for e in case["events"]
        ), where
        unshard = [("all_gather", "other", "unshard", case["out_bytes"])]
        if case["impl"] == "all_gather":
            kv = 2 * case["kv_bytes"]
            expected = (
                [("all_gather", "forward", "attention", kv)]
                + unshard
                + [("reduce_scatter", "backward", "attention", kv)]
            )
        elif case["impl"] == "ulysses":
            q, kv = case["out_bytes"] // cp_size, 2 * case["local_kv_bytes"]
            inputs = [q + kv] if case["kv_heads"] == 4 else [q, kv]
            forward = [("all_to_all", "forward", "attention", b) for b in (*inputs, q)]
            backward = [("all_to_all", "backward", "attention", b) for b in (q, *reversed(inputs))]
            expected = forward + unshard + backward
        else:
            block = 2 * case["local_kv_bytes"]
            expected = (
                [("all_to_all", "forward", "attention", block)] * (cp_size - 1)
                + unshard
                + [("all_to_all", "backward", "attention", block)] * (cp_size - 1)
            )
        assert events == expected, where


@pytest.mark.distributed
def test_invalid_layouts_raise_in_workers(ranks):
    for rank in ranks:
        for _layout, entry in rank["layouts"].items():
            if len(entry["cp_ranks"]) == 1:
                continue
            cp_size = len(entry["cp_ranks"])
            assert entry["invalid"]["shard_bad_seq_len"].startswith("ValueError: seq_len="), entry["invalid"]
            assert f"multiple of 2*cp = {2 * cp_size}" in entry["invalid"]["shard_bad_seq_len"]
            assert "load_balanced_positions" in entry["invalid"]["wrong_positions"]
            assert "load_balanced_positions" in entry["invalid"]["ulysses_wrong_positions"]
            assert entry["invalid"]["ulysses_heads"].startswith(
                f"ValueError: Ulysses gives each of the cp={cp_size} ranks whole heads: query heads ({cp_size + 1})"
            )


def test_load_balanced_positions_hand_derived():
    for cp_size, expected in POSITIONS_16.items():
        held = [load_balanced_positions(16, cp_size, i).tolist() for i in range(cp_size)]
        assert held == expected
        assert sorted(sum(held, [])) == list(range(16))
    assert load_balanced_positions(16, 1, 0).tolist() == list(range(16))


@pytest.mark.parametrize("seq_len, cp_size", [(15, 2), (12, 4), (6, 2), (0, 2)])
def test_seq_len_not_divisible_by_2cp_raises(seq_len, cp_size):
    with pytest.raises(ValueError, match=rf"seq_len={seq_len} must be a positive multiple of 2\*cp = {2 * cp_size}"):
        load_balanced_positions(seq_len, cp_size, 0)


def test_bad_cp_index_raises():
    with pytest.raises(ValueError, match="cp_index"):
        load_balanced_positions(16, 2, 2)


@pytest.mark.parametrize("causal, scale", [(True, None), (False, None), (True, 0.3)])
def test_cp_group_of_one_is_plain_attention_without_communication(causal, scale):
    solo = GroupInfo("cp", (0,), None)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 10, 8, generator=gen, requires_grad=True) for _ in range(3))  # odd chunks ok
    positions = shard_sequence(torch.arange(10), 0, solo)
    with trace.record() as rec:
        out = unshard_sequence(
            context_parallel_attention(q, k, v, solo, positions, causal=causal, scale=scale), 2, solo
        )
        out.sum().backward()
    assert rec.events == []
    ref_in = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal, scale=scale)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    for mine, theirs in zip((q, k, v), ref_in):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_ulysses_group_of_one_is_plain_attention_without_communication(causal):
    solo = GroupInfo("cp", (0,), None)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 10, 8, generator=gen, requires_grad=True) for _ in range(3))
    with trace.record() as rec:
        out = ulysses_attention(q, k, v, solo, torch.arange(10), causal=causal)
        out.sum().backward()
    assert rec.events == []
    ref_in = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref_in, is_causal=causal).sum().backward()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(*ref_in, is_causal=causal), atol=1e-6, rtol=0)
    for mine, theirs in zip((q, k, v), ref_in):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-6, rtol=0)


def test_bad_arguments_raise():
    solo = GroupInfo("cp", (0,), None)
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="impl"):
        context_parallel_attention(q, q, q, solo, torch.arange(4), impl="nope")
    with pytest.raises(ValueError, match="positions"):
        context_parallel_attention(q, q, q, solo, torch.arange(3))
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        context_parallel_attention(q, torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 4, 8), solo, torch.arange(4))
    with pytest.raises(ValueError, match="positions"):
        ulysses_attention(q, q, q, solo, torch.arange(3))
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        ulysses_attention(q, torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 4, 8), solo, torch.arange(4))
