"""Notebook 01's DDP-bucketing lesson: torch's DDP on M1's MLP, 2 gloo ranks, bucket_cap_mb = 1/64 (16384 B).

Hand counts (float32): the root's inp (16*32 + 32) and head (32*8 + 8) and two blocks of norm 32 + w1
(32*64 + 64) + w2 (64*32 + 32) make 9256 parameters, 37024 B. A reducer filling buckets in the order the
gradients arrive, closing one at 16384 B or more, makes 3 of them whichever of a layer's weight and bias
comes first: head + block 1's w2 and w1 pass 16384 B within w1; block 1's norm + block 0's w2 and w1 pass
it again within block 0's w1; block 0's norm and inp are the rest. Step 0 has one bucket (torch 2.13 puts
every parameter in one until it has seen an order), issued after the last gradient; from step 1 the first
two buckets are issued while backward still computes (before the last gradient), the last one holds it.
"""

from __future__ import annotations

import pytest
from worker_results import run_worker

from hyper_parallel.viz.ddp_buckets import bucket_steps, ddp_buckets_figure
from launch.notebook.ddp_lesson import bucket_text

LAYERS_BACKWARD = [  # (weight bytes, bias bytes) of each layer, in the order backward reaches them
    ("head", 32 * 8 * 4, 8 * 4),
    ("blocks.1.w2", 64 * 32 * 4, 32 * 4),
    ("blocks.1.w1", 32 * 64 * 4, 64 * 4),
    ("blocks.1.norm", 32 * 4, 0),
    ("blocks.0.w2", 64 * 32 * 4, 32 * 4),
    ("blocks.0.w1", 32 * 64 * 4, 64 * 4),
    ("blocks.0.norm", 32 * 4, 0),
    ("inp", 16 * 32 * 4, 32 * 4),
]
CAP = 16384


def greedy(sizes: list[tuple[str, int]], cap: int) -> list[list[str]]:
    """Buckets closed as soon as they hold ``cap`` bytes or more (torch's _compute_bucket_assignment_by_size)."""
    buckets, held = [[]], 0
    for name, nbytes in sizes:
        buckets[-1].append(name)
        held += nbytes
        if held >= cap:
            buckets, held = [*buckets, []], 0
    return [b for b in buckets if b]


def _sizes(bias_first: bool) -> list[tuple[str, int]]:
    out = []
    for layer, weight, bias in LAYERS_BACKWARD:
        pair = [(f"{layer}.weight", weight)] + ([(f"{layer}.bias", bias)] if bias else [])
        out.extend(reversed(pair) if bias_first else pair)
    return out


def test_the_hand_count_gives_three_buckets_either_way():
    assert sum(n for _, n in _sizes(True)) == 9256 * 4 == 37024
    assert len(greedy(_sizes(True), CAP)) == len(greedy(_sizes(False), CAP)) == 3


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return run_worker("ddp_buckets_worker", 2, tmp_path_factory.mktemp("ddp"), "ddp_buckets", timeout=120)


@pytest.mark.distributed
def test_ddp_buckets_on_the_trace_are_the_hand_count(probe):
    for found in probe:
        assert found["bucket_cap_bytes"] == CAP
        steps = bucket_steps(found["events"])
        first, *later = steps
        assert [len(s["buckets"]) for s in steps] == [1, 3, 3]
        assert first["buckets"][0]["bytes"] == 37024 and first["overlapped"] == 0
        for step in later:
            arrivals = [
                e["parameter"] for e in found["events"] if e.get("kind") == "gradient" and e["step"] == step["step"]
            ]
            sizes = dict(_sizes(True))
            expected = greedy([(name, sizes[name]) for name in arrivals], CAP)
            assert [b["parameters"] for b in step["buckets"]] == expected
            assert sum(b["bytes"] for b in step["buckets"]) == 37024
            assert step["overlapped"] == 2  # every bucket but the one holding the last gradient
            second = step["buckets"][1]["parameters"]  # 01's text: it cuts across the blocks
            assert "blocks.1.norm.weight" in second and "blocks.0.w1.weight" in second


@pytest.mark.distributed
def test_ddp_trains_as_one_process_on_the_whole_batch(probe):
    from hyper_parallel.benchmark.ddp_buckets import single_process_reference

    reference = single_process_reference()
    import torch

    for found in probe:
        for name, values in reference.items():
            assert torch.allclose(torch.tensor(found["parameters"][name]), torch.tensor(values), atol=1e-6), name


@pytest.mark.distributed
def test_the_text_and_figure_say_what_the_trace_holds(probe):
    text = bucket_text(probe[0])
    assert "step 0: 1 all-reduce(s); 0 issued before" in text and "step 1: 3 all-reduce(s); 2 issued before" in text
    fig = ddp_buckets_figure(probe[0]["events"])
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [
        "step 0: 1 bucket(s), 0 issued before the last gradient",
        "step 1: 3 bucket(s), 2 issued before the last gradient",
    ]
