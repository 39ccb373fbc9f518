"""Async TP's pipelined collectives (hyper_parallel.parallel.async_tp) against the one-shot ones.

One 4-rank launch of tests/workers/async_tp_cases.py runs, on tp groups of 4 and 2 and for every chunk
count that cuts the shard, the gather-then-matmul and matmul-then-scatter steps forward and backward,
next to autograd_comm's single all-gather / reduce-scatter with F.linear. Checked per rank:

* the same outputs and gradients: float64 to 1e-12, float32 to a bound derived from float32's rounding
  (the pipelined path sums the same products in another order, see ``FLOAT32_BOUND``);
* one traced collective per chunk (``chunk`` 0..c-1), each moving 1/c of the one-shot collective's bytes,
  so the same bytes in all;
* the pipeline: while chunk k of a gather is in flight (issue to wait), the matmul of an earlier chunk
  runs (a compute span inside that interval); while chunk k of a scatter is in flight, a later chunk's
  matmul runs.
"""

from __future__ import annotations

import pytest
from worker_results import run_worker

from hyper_parallel.parallel.async_tp import check_chunks

WORLD = 4
FLOAT32_BOUND = 64 * 2.0**-24 * 8
"""|pipelined - one-shot| in float32: each output or gradient entry is a sum of at most 64 products
(HIDDEN 12 x SEQ 16 x BATCH 2 over a weight gradient, fewer elsewhere) of values below ~8 in magnitude
(standard normal inputs, products summed); reordering a sum of n terms changes it by at most
n * eps/2 * sum|terms|, bounded here by 64 * 2^-24 * 8 per entry (about 3e-5)."""


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_worker("async_tp_cases", WORLD, tmp_path_factory.mktemp("async_tp"), "async_tp", timeout=600)


def _results(ranks):
    for rank, cases in enumerate(ranks):
        for name, result in cases.items():
            assert "error" not in result, f"rank {rank} {name}:\n{result.get('error')}"
            yield rank, name, result


def _chunks(name: str) -> int:
    return int(name.split("-")[2][1:])


def _collectives(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] == "collective"]


@pytest.mark.distributed
def test_same_numbers_as_one_collective(ranks):
    seen = 0
    for rank, name, result in _results(ranks):
        bound = 1e-12 if name.endswith("float64") else FLOAT32_BOUND
        assert result["out_diff"] <= bound and result["grad_diff"] <= bound, (rank, name, result["out_diff"])
        seen += 1
    assert seen == WORLD * 2 * 2 * (3 + 3)  # ranks x kinds x dtypes x (chunks 1, 2, 4 on tp4 and on tp2)


@pytest.mark.distributed
def test_one_traced_collective_per_chunk_and_the_same_bytes(ranks):
    for rank, name, result in _results(ranks):
        chunks = _chunks(name)
        pipelined, one_shot = _collectives(result["events"]), _collectives(result["reference_events"])
        assert len(pipelined) == 2 * chunks and len(one_shot) == 2, (rank, name)  # forward and backward
        for direction in (0, 1):
            mine = pipelined[direction * chunks : (direction + 1) * chunks]
            assert [e["chunk"] for e in mine] == list(range(chunks)), (rank, name)
            assert {e["op"] for e in mine} == {one_shot[direction]["op"]}
            assert all(e["asynchronous"] and e["group"] == "tp" for e in mine)
            assert sum(e["bytes"] for e in mine) == one_shot[direction]["bytes"], (rank, name)


def _compute_inside(events: list[dict], start: float, end: float) -> bool:
    """A compute span began while the collective was in flight (its issue to its wait): the span ends a few
    microseconds after the wait's clock reading, when the wait closes it."""
    return any(e["kind"] == "compute" and start <= e["t_start"] < end for e in events)


@pytest.mark.distributed
def test_a_chunk_is_in_flight_while_another_multiplies(ranks):
    """Forward of a gather: chunk k (k >= 1) is waited for after chunk k-1's rows were multiplied, so a
    compute span lies inside its issue-to-wait interval; chunk 0 hides behind this rank's own rows.
    Forward of a scatter: chunk k (k < c-1) is issued before chunk k+1's rows are multiplied."""
    checked = 0
    for rank, name, result in _results(ranks):
        chunks = _chunks(name)
        forward = _collectives(result["events"])[:chunks]
        for k, event in enumerate(forward):
            if name.startswith("scatter") and k == chunks - 1:
                continue  # the last chunk has no later matmul to hide behind
            assert _compute_inside(result["events"], event["t_start"], event["t_wait"]), (rank, name, k)
            checked += 1
    assert checked > 0


def test_chunk_count_must_cut_the_shard():
    check_chunks(8, 4)
    with pytest.raises(
        ValueError, match=r"chunks=3 pieces, which does not divide it; choose chunks from \[1, 2, 4, 8\]"
    ):
        check_chunks(8, 3)
    with pytest.raises(ValueError, match="positive integer"):
        check_chunks(8, 0)
