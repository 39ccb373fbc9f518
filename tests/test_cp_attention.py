"""Context-parallel attention (hyper_parallel.parallel.cp: K/V all-gather; hyper_parallel.parallel.ring:
K/V around the ring with overlap) and Ulysses attention (hyper_parallel.parallel.ulysses: all-to-all to
head shards and back) against the unsplit computation, with the ring's work per rank and memory.

One torchrun launch per world size (2 and 4 ranks) runs every case of
tests/workers/cp_attention_cases.py; the tests below assert on what each rank wrote. The layout
functions and the cp-of-one path need no process group and are tested in this process.
"""

import functools

import pytest
import torch
import torch.nn.functional as F
from worker_results import run_worker

from hyper_parallel import trace
from hyper_parallel.comm import GroupInfo
from hyper_parallel.parallel.cp import context_parallel_attention
from hyper_parallel.parallel.ring import ring_attention
from hyper_parallel.parallel.sequence_layout import load_balanced_positions, shard_sequence, unshard_sequence
from hyper_parallel.parallel.ulysses import ulysses_attention

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
    return run_worker("cp_attention_cases", nproc, tmp_path_factory.mktemp(f"cp{nproc}"), "cp", timeout=150)


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
            for scheme in ("ring", "ulysses"):
                errors = entry[f"transformer_{scheme}"]
                assert errors["loss"] <= 1e-5 and errors["param_grads"] <= 1e-5, (rank["rank"], layout, scheme, errors)


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
            assert len([c for c in ran if c[0] != "ulysses"]) == 12, (rank["rank"], layout)


def _ring_events(case: dict, cp_ranks: list[int], rank: int) -> list[tuple]:
    """The ring's P2P events of one attention call, by hand. Forward: cp-1 steps, each an isend of the
    stacked K/V block in hand to the next rank and an irecv from the previous one. Backward retraces the
    ring the other way: cp-2 K/V blocks (the owner's own block is saved, not sent back) and cp-1 dK/dV
    blocks, each sent to the previous rank and received from the next. Every message is one block: 2 x
    the local K bytes (float32 / float64 gradients: the same size). Sorted: the order of the backward's
    two kinds of exchange interleaves."""
    size, index = len(cp_ranks), cp_ranks.index(rank)
    after, before = cp_ranks[(index + 1) % size], cp_ranks[(index - 1) % size]
    block = 2 * case["local_kv_bytes"]
    forward = [("send", "forward", block, after), ("recv", "forward", block, before)] * (size - 1)
    backward = [("send", "backward", block, before), ("recv", "backward", block, after)] * (2 * size - 3)
    return sorted(forward + backward)


@pytest.mark.distributed
def test_communication_per_attention_call(ranks):
    """all_gather impl: one all-gather of stacked K/V forward, one reduce-scatter backward, each of
    the full K+V bytes. ring (zig-zag or contiguous): the sends and receives of ``_ring_events``, each
    asynchronous, between this rank and its ring neighbour. unshard: one all-gather forward, nothing in
    backward. ulysses: forward one all-to-all of the stacked local q/k/v (3 local K bytes; GQA: q and
    stacked K/V, two calls) and one of the output (local q bytes), backward the same all-to-alls in
    reverse order. A cp group of one communicates nothing."""
    for rank, layout, entry, case in _cases(ranks):
        cp_ranks, cp_size = entry["cp_ranks"], len(entry["cp_ranks"])
        events = [(e["op"], e["phase"], e["module"], e["bytes"]) for e in case["events"]]
        where = f"rank {rank} {layout} {case['impl']} causal={case['causal']}"
        if cp_size == 1:
            assert events == [], where
            continue
        assert all(e["group"] == "cp" and e["dtype"] == case["dtype"] for e in case["events"]), where
        unshard = [("all_gather", "other", "unshard", case["out_bytes"])]
        if case["impl"].startswith("ring"):
            p2p = [e for e in case["events"] if e["op"] in ("send", "recv")]
            assert [e for e in events if e[0] not in ("send", "recv")] == unshard, where
            assert all(e["asynchronous"] and e["ranks"] == sorted({rank, e["peer"]}) for e in p2p), where
            assert sorted((e["op"], e["phase"], e["bytes"], e["peer"]) for e in p2p) == _ring_events(
                case, cp_ranks, rank
            ), where
            continue
        assert all(e["ranks"] == cp_ranks for e in case["events"]), where
        if case["impl"] == "all_gather":
            kv = 2 * case["kv_bytes"]
            expected = (
                [("all_gather", "forward", "attention", kv)]
                + unshard
                + [("reduce_scatter", "backward", "attention", kv)]
            )
        else:
            q, kv = case["out_bytes"] // cp_size, 2 * case["local_kv_bytes"]
            inputs = [q + kv] if case["kv_heads"] == 4 else [q, kv]
            forward = [("all_to_all", "forward", "attention", b) for b in (*inputs, q)]
            backward = [("all_to_all", "backward", "attention", b) for b in (q, *reversed(inputs))]
            expected = forward + unshard + backward
        assert events == expected, where


@pytest.mark.distributed
def test_ring_computes_each_block_while_the_next_is_in_flight(ranks):
    """Overlap, from the order of events on one rank's clock (no durations): the ring records each step's
    compute (``"kind": "ring"``), and every exchange is issued before the next block's attention starts
    and waited for only after it ended, in forward (the next K/V block) and in backward (the next K/V
    block, posted before a step's compute; a block's dK/dV, posted after it and waited for after the
    following step). A ring that waited at once would wait before that compute began."""
    for rank, layout, entry, case in _cases(ranks):
        if not case["impl"].startswith("ring") or len(entry["cp_ranks"]) == 1:
            continue
        cp_size, where = len(entry["cp_ranks"]), (rank, layout, case["impl"], case["causal"])
        steps = case["ring_steps"]
        assert sorted((s["phase"], s["ring_step"]) for s in steps) == sorted(
            (phase, step) for phase in ("backward", "forward") for step in range(cp_size)
        ), where
        for send in (e for e in case["events"] if e["op"] == "send"):
            following = [s for s in steps if s["phase"] == send["phase"] and s["t_start"] >= send["t_start"]]
            block = min(following, key=lambda s: s["t_start"])
            assert block["t_end"] <= send["t_wait"], where


@pytest.mark.distributed
def test_ring_attention_flops_per_rank(ranks):
    """Measured matmul FLOPs of one causal attention call, forward and backward (torch's
    FlopCounterMode on each rank), against the hand count: a computed (query chunk, key chunk) pair of
    sq x sk costs 14 B H D sq sk (forward q k^T and p v: 2 + 2; backward recomputes q k^T: 2, and dv, dp,
    dq, dk: 2 each). Zig-zag, s = S/cp tokens per rank in 2 chunks: 3 quarter pairs on its own block, 2 on
    each of the cp-1 others, (2 cp + 1) s^2 / 4 on every rank: equal work. Contiguous: rank i computes
    its own block masked and the i blocks before it whole, (i + 1) s^2: rank cp-1 does cp times rank 0's
    work. The all-gather computes every score, masked or not: 12 B H D s S on every rank (no recompute)."""
    world = len(ranks)
    for layout in ranks[0]["layouts"]:
        cp_ranks = ranks[0]["layouts"][layout]["cp_ranks"]
        cp_size = len(cp_ranks)
        if cp_size == 1:
            continue
        s = 32 // cp_size  # SEQ_LEN of the worker's work case
        unit = 14 * 2 * 4 * 8  # 14 B H D with B=2, H=4, D=8
        for rank in ranks:
            index = rank["layouts"][layout]["cp_ranks"].index(rank["rank"])
            work = rank["layouts"][layout]["work"]
            assert work["ring"]["flops"] == unit * (2 * cp_size + 1) * s * s // 4, (world, layout, rank["rank"])
            assert work["ring_contiguous"]["flops"] == unit * (index + 1) * s * s, (world, layout, rank["rank"])
            assert work["all_gather"]["flops"] == 12 * 2 * 4 * 8 * s * 32, (world, layout, rank["rank"])
        zigzag = {rank["layouts"][layout]["work"]["ring"]["flops"] for rank in ranks}
        assert len(zigzag) == 1


@pytest.mark.distributed
def test_ring_keeps_less_for_backward_than_the_all_gather(ranks):
    """Bytes autograd saves for backward in one causal attention call (B=2, H=4, D=8, S=32, float32), by
    hand. Ring: q, k, v and the output (B H s D each), the last K/V block received (2 B H s D) and one
    log-sum-exp per query row (B H s): 6 B H s D + B H s values, whatever cp is. The all-gather keeps the
    gathered K/V (2 B H S D) and every probability (B H s S): more on every rank, growing with S."""
    for rank in ranks:
        for layout, entry in rank["layouts"].items():
            cp_size = len(entry["cp_ranks"])
            if cp_size == 1:
                continue
            s, work = 32 // cp_size, entry["work"]
            assert work["ring"]["saved_bytes"] == 4 * (6 * 2 * 4 * s * 8 + 2 * 4 * s), (rank["rank"], layout)
            assert work["all_gather"]["saved_bytes"] > 2 * 2 * 4 * 32 * 8 * 4 + 2 * 4 * s * 32 * 4
            assert work["ring"]["saved_bytes"] < work["all_gather"]["saved_bytes"]


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


@pytest.mark.distributed
def test_ulysses_ring_2d_matches_unsplit_attention(ranks):
    """ulysses 2 x ring 2 on 4 ranks (32 tokens): rank (ring r, ulysses u) holds slice u of ring rank r's
    zig-zag chunks (ring 0: tokens 0-7 and 24-31, so ulysses 0 holds 0-7); its output and q/k/v gradients
    equal float64 SDPA at those positions (causal, non-causal, GQA with 2 K/V heads). Per attention call:
    forward one all-to-all of stacked q/k/v on ulysses (GQA: q, then stacked K/V), the ring's one send and
    one receive of a K/V block on cp (the block after the all-to-all: 2 x the local K bytes again), the
    output's all-to-all; backward the ring's one dK/dV block each way and the all-to-alls reversed."""
    if len(ranks) != 4:
        pytest.skip("the 2-D case runs on 4 ranks")
    for rank in ranks:
        two_d = rank["two_d"]
        assert two_d["ulysses_ranks"] == [rank["rank"] // 2 * 2, rank["rank"] // 2 * 2 + 1]
        assert two_d["ring_ranks"] == [rank["rank"] % 2, rank["rank"] % 2 + 2]
        ring, slice_ = rank["rank"] // 2, rank["rank"] % 2
        share = [*range(ring * 8, ring * 8 + 8), *range(24 - ring * 8, 32 - ring * 8)]
        for case in two_d["cases"]:
            assert case["positions"] == share[slice_ * 8 : slice_ * 8 + 8]
            assert max(case["errors"].values()) <= TOLERANCE["float32"], (rank["rank"], case)
            q, kv = case["local_q_bytes"], 2 * case["local_kv_bytes"]
            inputs = [q + kv] if case["kv_heads"] == 4 else [q, kv]
            ulysses_calls = [("all_to_all", "ulysses", "forward", b) for b in (*inputs, q)]
            ulysses_calls += [("all_to_all", "ulysses", "backward", b) for b in (q, *reversed(inputs))]
            ring_calls = [(op, "cp", phase, kv) for phase in ("forward", "backward") for op in ("send", "recv")]
            events = [(e["op"], e["group"], e["phase"], e["bytes"]) for e in case["events"]]
            assert sorted(events) == sorted(ulysses_calls + ring_calls), rank["rank"]


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


SOLO_SCHEMES = {
    "ulysses": ulysses_attention,
    "ring": ring_attention,
    "ring_contiguous": functools.partial(ring_attention, zigzag=False),
}


@pytest.mark.parametrize("scheme", SOLO_SCHEMES)
@pytest.mark.parametrize("causal", [True, False])
def test_ulysses_or_ring_of_one_is_plain_attention_without_communication(scheme, causal):
    solo = GroupInfo("cp", (0,), None)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 10, 8, generator=gen, requires_grad=True) for _ in range(3))
    with trace.record() as rec:
        out = SOLO_SCHEMES[scheme](q, k, v, solo, torch.arange(10), causal=causal)
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


def _plan(cp_size: int, index: int, zigzag: bool, seq_len: int = 32):
    from hyper_parallel.parallel.ring import RingPlan
    from hyper_parallel.parallel.sequence_layout import gathered_positions

    group = GroupInfo("cp", tuple(range(cp_size)), None)
    positions = gathered_positions(seq_len, cp_size, zigzag).view(cp_size, -1)
    return RingPlan(group, index, positions, 2 if zigzag else 1, True, 1.0, torch.float32)


def test_ring_pairs_by_hand():
    """cp = 4, 32 tokens: zig-zag rank 1 holds chunks 1 and 6 (4 tokens each, rows 0-3 and 4-7). On its own
    block: chunk 1 x 1 and 6 x 6 masked, 6 x 1 whole, 1 x 6 skipped (3 pairs); on rank 0's block (chunks 0,
    7): 1 x 0 and 6 x 0 whole; on rank 2's (chunks 2, 5): 6 x 2 and 6 x 5 whole. Contiguous rank 1 holds
    tokens 8-15: its own block masked, rank 0's whole, ranks 2 and 3's skipped."""
    first, second = slice(0, 4), slice(4, 8)
    plan = _plan(4, 1, zigzag=True)
    assert [plan.block_at(step) for step in range(4)] == [1, 0, 3, 2]
    pairs = {block: [(p.queries, p.keys, p.masked) for p in plan.pairs(block)] for block in range(4)}
    assert pairs[1] == [(first, first, True), (second, first, False), (second, second, True)]
    assert pairs[0] == [(first, first, False), (second, first, False)]
    assert pairs[2] == [(second, first, False), (second, second, False)]
    assert pairs[3] == [(second, first, False), (second, second, False)]
    contiguous = _plan(4, 1, zigzag=False)
    whole = slice(0, 8)
    assert [[(p.queries, p.keys, p.masked) for p in contiguous.pairs(b)] for b in range(4)] == [
        [(whole, whole, False)],
        [(whole, whole, True)],
        [],
        [],
    ]


def test_online_softmax_merge_equals_softmax():
    """Blocks of keys folded in any order with merge_partial give softmax attention and the log of its
    denominator exactly (float64), masked rows included."""
    from hyper_parallel.parallel.attention_blocks import attend, block_attention, merge_partial

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 12, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    positions = torch.arange(12)
    for causal in (False, True):
        reference = attend(q, k, v, positions, positions, causal, 0.35, torch.float64)
        scores = (q @ k.transpose(-2, -1)) * 0.35
        if causal:
            scores = scores.masked_fill(positions[:, None] < positions[None, :], float("-inf"))
        out, lse = torch.zeros_like(q), torch.full(q.shape[:3], float("-inf"), dtype=torch.float64)
        for keys in (slice(8, 12), slice(0, 4), slice(4, 8)):
            block = block_attention(q, k[:, :, keys], v[:, :, keys], positions, positions[keys], causal, 0.35, q.dtype)
            out, lse = merge_partial(out, lse, *block)
        torch.testing.assert_close(out, reference, rtol=0, atol=1e-12)
        torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_block_backward_from_the_final_lse_equals_autograd(kv_heads):
    """The gradients of each key block, recomputed from the final log-sum-exp alone and summed over
    the blocks, equal autograd through softmax attention (float64; causal; GQA sums the repeats)."""
    from hyper_parallel.parallel.attention_blocks import attend, block_attention_backward, scores

    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 12, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, 12, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    dout = torch.randn(2, 4, 12, 8, generator=gen, dtype=torch.float64)
    positions = torch.arange(12)
    out = attend(q, k, v, positions, positions, True, 0.35, torch.float64)
    out.backward(dout)
    lse = torch.logsumexp(scores(q, k, positions, positions, True, 0.35, torch.float64), dim=-1).detach()
    delta = (dout * out.detach()).sum(dim=-1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for keys in (slice(0, 6), slice(6, 12)):
        grads = block_attention_backward(
            q.detach(),
            k.detach()[:, :, keys],
            v.detach()[:, :, keys],
            dout,
            delta,
            lse,
            positions,
            positions[keys],
            True,
            0.35,
            torch.float64,
        )
        dq += grads[0]
        dk[:, :, keys] += grads[1]
        dv[:, :, keys] += grads[2]
    for mine, theirs in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)


def test_ring_work_replayed_in_one_process_equals_the_hand_count():
    """ring.work_per_rank (the ring's block kernels of every rank replayed under FlopCounterMode, one head,
    head_dim 8): 14 x 8 FLOPs per unit of (query chunk x key chunk) area, as the distributed test counts.
    Zig-zag, 32 tokens on cp = 4 (s = 8): (2 cp + 1) s^2 / 4 = 144 on every rank; contiguous (i + 1) s^2."""
    from hyper_parallel.parallel.ring import work_per_rank

    assert work_per_rank(32, 4) == [14 * 8 * 144] * 4
    assert work_per_rank(32, 4, zigzag=False) == [14 * 8 * (i + 1) * 64 for i in range(4)]
