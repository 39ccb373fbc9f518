"""`python -m launch plan` refuses what cannot run: exit status 2, the rule, and the nearest value that
would be accepted (worked out here for each row, independently of the planner's own arithmetic).

Each row: the arguments, then text the error must contain. The nearest valid values, by hand:
    --batch 0 on 512 ranks of FSDP        dp = 512: the smallest batch is 512 sequences
    --seq-len 0 / -16 with tp=8 (SP)      the sequence must split over tp: 8
    --seq-len -16 with cp=2, tp=4         CP's 2 cp chunks each split by tp: 2 x 2 x 4 = 16
    --tp 3 on 512                         the divisors of 512 nearest 3: 2 and 4 (tie: the smaller), never
                                          world 513
    --pp 64 on 32 layers, 512 ranks       pp must divide 32 and 512: 32 is nearest 64
    --pp 3 on 32 layers, 48 ranks         pp divides 48 (2, 3, 4, 6, 8, ...) and 32 (2, 4, 8, 16, 32): 2 or 4 -> 2
    --pp 4, 1F1B, 4 rows per rank         one microbatch of 4 rows < pp = 4: micro-batch 1 gives 4
    interleaved, pp 4, batch 1024         8 rows per rank; micro-batch 8 is one microbatch, not a multiple
                                          of pp = 4; the largest micro-batch giving a multiple: 2 (4 of them)
    interleaved, pp 4, 3 stages per rank  12 stages cannot split 32 layers for any pp: virtual stages 2
                                          (32 = 4 x 2 x 4) is the nearest that does
"""

from __future__ import annotations

import contextlib
import io

import pytest

from launch import cli

LLAMA_512 = ["--world", "512", "--model", "llama-8b-like"]

REFUSALS = [
    (LLAMA_512 + ["--batch", "0"], ["--batch (sequences per step) must be >= 1, got 0", "nearest valid --batch: 512"]),
    (LLAMA_512 + ["--batch", "-8"], ["must be >= 1, got -8", "nearest valid --batch: 512"]),
    (LLAMA_512 + ["--tp", "8", "--seq-len", "0"], ["--seq-len (tokens per sequence) must be >= 1", "--seq-len: 8"]),
    (LLAMA_512 + ["--tp", "4", "--cp", "2", "--seq-len", "-16"], ["got -16", "nearest valid --seq-len: 16"]),
    (LLAMA_512 + ["--micro-batch", "0"], ["micro_batch must be >= 1, got 0", "nearest valid micro_batch: 1"]),
    (LLAMA_512 + ["--grad-accum", "-1"], ["grad_accum must be >= 1, got -1", "nearest valid grad_accum: 1"]),
    (LLAMA_512 + ["--compare", "--top", "0"], ["--top (layouts shown by --compare) must be >= 1", "--top: 1"]),
    (LLAMA_512 + ["--compare", "--top", "-1"], ["got -1", "nearest valid --top: 1"]),
    (LLAMA_512 + ["--tp", "3"], ["tp=3 does not divide world_size=512", "nearest valid tp: 2"]),
    (
        LLAMA_512 + ["--tp", "8", "--cp", "8", "--dp-shard", "16"],
        ["= 1024 does not divide world_size=512", "nearest valid dp_shard with the others kept: 8"],
    ),
    (["--world", "4096", "--dp-replicate", "3", "--model", "small"], ["nearest valid dp_replicate: 2"]),
    (LLAMA_512 + ["--pp", "64"], ["64 stages for n_layers=32: each stage needs a layer", "nearest valid pp: 32"]),
    (
        LLAMA_512 + ["--pp", "4", "--micro-batch", "1", "--stage-layers", "8,8,8"],
        ["stage_layers [8, 8, 8] must give 4 stages (pp x virtual_stages)", "got 3 stages summing to 24"],
    ),
    (LLAMA_512 + ["--pp", "4", "--micro-batch", "1", "--stage-layers", "8,8,x,8"], ["give integers separated"]),
    (
        LLAMA_512 + ["--pp", "4"],
        ["1f1b needs at least pp = 4 microbatches per step, got 1", "nearest valid --micro-batch: 1"],
    ),
    (
        LLAMA_512 + ["--pp", "4", "--batch", "1152", "--pp-schedule", "interleaved-1f1b", "--micro-batch", "1"],
        ["a multiple of its rounds, max(1, m // pp) (torch's flexible interleaving), got 9", "--micro-batch: 9"],
    ),
    (
        LLAMA_512 + ["--pp", "4", "--pp-schedule", "zbv", "--virtual-stages", "3", "--micro-batch", "1"],
        ["zbv and dualpipev run exactly two", "nearest valid virtual_stages: 2"],
    ),
    (
        LLAMA_512 + ["--pp", "4", "--pp-schedule", "dualpipev", "--micro-batch", "1"],
        ["dualpipev needs at least as many microbatches as stages, 8, got 4", "raise the batch (rows per rank: 4)"],
    ),
    (LLAMA_512 + ["--pp", "2", "--virtual-stages", "2"], ["only interleaved_1f1b runs several stages per rank"]),
    (LLAMA_512 + ["--layouts", "tp=8,tp=4; dp_shard=512"], ["names tp twice (tp=8 and tp=4)"]),
    (LLAMA_512 + ["--layouts", "tp=3"], ["tp=3 does not divide world_size=512", "nearest valid tp: 2"]),
    (LLAMA_512 + ["--layouts", "dp_shard=512", "--batch", "0"], ["nearest valid --batch: 512"]),
    (LLAMA_512 + ["--peak-tflops", "nan"], ["--peak-tflops must be a finite number > 0, got nan", "989"]),
    (LLAMA_512 + ["--peak-tflops", "-1"], ["must be a finite number > 0, got -1.0"]),
    (LLAMA_512 + ["--inter-node-gbs", "inf"], ["--inter-node-gbs must be a finite number > 0, got inf", ": 45"]),
    (
        LLAMA_512 + ["--memory-gib", "0"],
        ["--memory-gib must be a finite number > 0", "nearest valid --memory-gib: 79.6"],
    ),
    (LLAMA_512 + ["--memory-reserve-gib", "nan"], ["--memory-reserve-gib must be a finite number >= 0", ": 1 (the"]),
    (LLAMA_512 + ["--memory-reserve-gib", "-2"], ["got -2.0", "nearest valid --memory-reserve-gib: 1 (the"]),
    (LLAMA_512 + ["--gpus-per-node", "12"], ["gpus_per_node=12 must be >= 1 and divide", "--gpus-per-node: 16"]),
    (LLAMA_512 + ["--gpus-per-node", "0"], ["gpus_per_node=0 must be >= 1", "--gpus-per-node: 1"]),
    (LLAMA_512 + ["--tp", "-2"], ["tp must be >= 1, got tp=-2"]),
    (LLAMA_512 + ["--rank", "-1"], ["--rank -1 is outside world_size=512"]),
]


def _plan(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["plan", *args])
    return code, err.getvalue()


@pytest.mark.parametrize("args, expected", REFUSALS, ids=[" ".join(a[4:]) for a, _ in REFUSALS])
def test_bad_input_exits_2_with_the_rule_and_the_nearest_valid_value(args, expected):
    code, err = _plan(args)
    assert code == 2, err
    for text in expected:
        assert text in err, (text, err)


def test_the_suggested_values_are_accepted():
    """The nearest valid values the table suggests do plan (exit 0), and a suggested degree divides the world."""
    accepted = [
        LLAMA_512 + ["--batch", "512"],
        LLAMA_512 + ["--tp", "8", "--seq-len", "8"],
        LLAMA_512 + ["--tp", "4", "--cp", "2", "--seq-len", "16", "--batch", "128"],
        LLAMA_512 + ["--tp", "2"],
        LLAMA_512 + ["--pp", "32", "--micro-batch", "1", "--batch", "512"],
        LLAMA_512 + ["--pp", "4", "--micro-batch", "1"],
        LLAMA_512 + ["--pp", "4", "--batch", "1024", "--pp-schedule", "interleaved-1f1b", "--micro-batch", "2"],
        LLAMA_512 + ["--pp", "4", "--pp-schedule", "interleaved-1f1b", "--virtual-stages", "2", "--micro-batch", "1"],
        LLAMA_512 + ["--gpus-per-node", "16"],
    ]
    for args in accepted:
        code, err = _plan([*args, "--json"])
        assert code == 0, (args, err)
