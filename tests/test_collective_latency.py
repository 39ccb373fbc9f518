"""NCCL's ring latency in the cost model (cost_model.layouts.ring_seconds) and DeepSpeed's ZeRO-3 call counts
(Stack.zero3_calls), each against a hand computation from NCCL's tuning constants and the module names."""

from __future__ import annotations

import pytest

from hyper_parallel.cost_model import estimate
from hyper_parallel.cost_model.calibration import published_runs
from hyper_parallel.cost_model.layouts import ring_seconds


def test_large_all_gather_on_192_nodes_waits_nccl_simple_ring_latency():
    """1,536 ranks on 192 nodes: 1,535 steps, 191 across nodes: 8.4 + 1,344 x 3.4 + 191 x 9.6 us = 6,411.6 us
    per call beside its bandwidth time (Simple: LL's quartered bandwidth loses on 1 s of transfer)."""
    assert ring_seconds("all_gather", 1536, 192, 1, 1.0) == pytest.approx(1.0 + 6411.6e-6, rel=1e-9)
    assert ring_seconds("reduce_scatter", 1536, 192, 10, 10.0) == pytest.approx(10 * (1.0 + 6411.6e-6), rel=1e-9)


def test_tiny_call_takes_nccl_ll_protocol():
    """A call of 1 us of bandwidth on 8 ranks in one node: Simple 8.4 + 7 x 3.4 + 1 = 33.2 us, LL 6.6 + 7 x
    0.47 + 3 x 1 = 12.89 us: NCCL picks LL."""
    assert ring_seconds("all_gather", 8, 1, 1, 1e-6) == pytest.approx(12.89e-6, rel=1e-9)


def test_other_collectives_are_bandwidth_only():
    assert ring_seconds("all_reduce", 1536, 192, 5, 2.0) == 2.0
    assert ring_seconds("all_gather", 1, 1, 5, 0.0) == 0.0


def test_deepspeed_zero3_issues_a_gather_per_module_and_a_reduce_scatter_per_parameter():
    """Megatron's GPT layer under DeepSpeed's ZeRO-3 of 2021: 6 modules with parameters (two LayerNorms,
    query_key_value, dense, h->4h, 4h->h) and 12 parameters (a weight and a bias each); the root: the word and
    position embeddings and the final LayerNorm, 3 modules and 4 parameters. FSDP2 issues one of each per unit."""
    run = next(r for r in published_runs() if r.name.startswith("DeepSpeed ZeRO-3 174.6B") and r.model.micro_batch == 1)
    layers = run.model.n_layers
    calls = {(c.op, c.phase): c.count for c in estimate(run.model, run.dims).collectives}
    assert calls[("all_gather", "forward")] == 6 * layers + 3
    assert calls[("all_gather", "backward")] == 6 * layers  # the root keeps its parameters gathered
    assert calls[("reduce_scatter", "backward")] == 12 * layers + 4
    fsdp2 = {(c.op, c.phase): c.count for c in estimate(run.model.replace(stack="torchtitan"), run.dims).collectives}
    assert fsdp2[("reduce_scatter", "backward")] == layers + 1
