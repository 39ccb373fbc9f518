"""Mesh algebra (docs/design.md §2): ParallelDims validation, derived degrees, group rank lists,
check_model shape rules, valid_choices, and the DeviceMeshes built by MeshViews.

Every expected number below is written literally or derived by the simple arithmetic stated next
to it, never by calling the library's own helpers. Single process; the DeviceMesh tests use
torch's "fake" process-group backend, so no worker is started.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import re

import pytest

from hyper_parallel.mesh import ParallelDims, valid_choices
from hyper_parallel.mesh_views import build_mesh

ALL_DIMS = ("dp_replicate", "dp_shard", "cp", "tp", "fsdp", "dp", "dp_cp", "efsdp", "ep", "etp")
DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp")


def _norm(groups):
    """Order-independent form of a list of rank groups."""
    return sorted(sorted(g) for g in groups)


def _is_valid(**kwargs) -> bool:
    try:
        ParallelDims(**kwargs)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# 1. invalid degree combinations: ValueError with the rule, the numbers and (where given) a hint
# --------------------------------------------------------------------------------------------

INVALID = [
    # --- world-size equation with an explicit dp_shard ---
    pytest.param(
        dict(world_size=8, dp_shard=2, tp=2),
        [
            "world-size equation violated",
            "1*2*1*2*1 = 4 != world_size=8",
            "nearest valid choice: dp_shard=4 (or dp_shard=-1)",
        ],
        id="ws-dp_shard-too-small",
    ),
    pytest.param(
        dict(world_size=8, dp_replicate=2, dp_shard=4, tp=2),
        ["world-size equation violated", "2*4*1*2*1 = 16 != world_size=8", "nearest valid choice: dp_shard=2"],
        id="ws-dp_shard-too-big",
    ),
    pytest.param(
        dict(world_size=8, dp_shard=3),
        ["world-size equation violated", "1*3*1*1*1 = 3 != world_size=8", "nearest valid choice: dp_shard=8"],
        id="ws-dp_shard-3",
    ),
    pytest.param(
        dict(world_size=4, dp_replicate=2, dp_shard=2, cp=2),
        ["world-size equation violated", "2*2*2*1*1 = 8 != world_size=4", "nearest valid choice: dp_shard=1"],
        id="ws-cp-overflows",
    ),
    pytest.param(
        dict(world_size=64, dp_replicate=2, dp_shard=4, cp=2, tp=2),
        ["world-size equation violated", "2*4*2*2*1 = 32 != world_size=64", "nearest valid choice: dp_shard=8"],
        id="ws-64",
    ),
    pytest.param(
        dict(world_size=8, dp_replicate=3, dp_shard=2),
        [
            "world-size equation violated",
            "3*2*1*1*1 = 6 != world_size=8",
            "the other degrees multiply to 3, which does not divide world_size=8",
            "run on world_size=6 ranks",
        ],
        id="ws-dp_replicate-3",
    ),
    # --- dp_shard=-1 cannot be inferred ---
    pytest.param(
        dict(world_size=6, cp=4),
        [
            "cannot infer dp_shard",
            "world_size=6 is not divisible by dp_replicate*cp*tp*pp = 1*4*1*1 = 4",
            "nearest valid world_size: 8",
        ],
        id="infer-cp4-ws6-tie-goes-up",
    ),
    pytest.param(
        dict(world_size=8, tp=3),
        ["cannot infer dp_shard", "1*1*3*1 = 3", "nearest valid world_size: 9"],
        id="infer-tp3",
    ),
    pytest.param(
        dict(world_size=8, dp_replicate=2, cp=2, tp=4),
        ["cannot infer dp_shard", "2*2*4*1 = 16", "nearest valid world_size: 16"],
        id="infer-too-many",
    ),
    pytest.param(
        dict(world_size=10, tp=4),
        ["cannot infer dp_shard", "world_size=10", "1*1*4*1 = 4", "nearest valid world_size: 12"],
        id="infer-tp4-ws10",
    ),
    pytest.param(
        dict(world_size=7, dp_replicate=2),
        ["cannot infer dp_shard", "2*1*1*1 = 2", "nearest valid world_size: 8"],
        id="infer-ws7",
    ),
    # --- pp is a factor of the world-size equation like the others ---
    pytest.param(
        dict(world_size=8, pp=3),
        ["cannot infer dp_shard", "1*1*1*3 = 3", "nearest valid world_size: 9"],
        id="infer-pp3",
    ),
    pytest.param(
        dict(world_size=16, dp_shard=4, pp=2, tp=4),
        ["world-size equation violated", "1*4*1*4*2 = 32 != world_size=16"],
        id="ws-pp2",
    ),
    # --- etp > 1 requires ep > 1 ---
    pytest.param(
        dict(world_size=8, tp=2, etp=2), ["etp=2 requires ep > 1", "set etp=1", "etp in {1, tp=2}"], id="etp2-ep1"
    ),
    pytest.param(dict(world_size=8, tp=4, etp=4), ["etp=4 requires ep > 1", "etp in {1, tp=4}"], id="etp4-ep1"),
    pytest.param(dict(world_size=8, etp=2), ["etp=2 requires ep > 1", "etp in {1, tp=1}"], id="etp2-ep1-tp1"),
    # --- with ep > 1, etp must be 1 or tp ---
    pytest.param(
        dict(world_size=8, tp=4, ep=2, etp=2),
        ["with ep=2, etp must be 1 or equal to tp=4; got etp=2"],
        id="etp-between",
    ),
    pytest.param(
        dict(world_size=8, tp=2, ep=2, etp=4),
        ["with ep=2, etp must be 1 or equal to tp=2; got etp=4"],
        id="etp-above-tp",
    ),
    pytest.param(
        dict(world_size=8, ep=2, etp=2), ["with ep=2, etp must be 1 or equal to tp=1; got etp=2"], id="etp-tp1"
    ),
    # --- etp == tp: ep % cp == 0 and (dp_shard*cp) % ep == 0 ---
    pytest.param(
        dict(world_size=8, cp=4, tp=2, ep=2, etp=2),
        [
            "ep=2 does not fit the mesh",
            "etp == tp: EP borrows all of cp and part of dp_shard",
            "ep must be a multiple of cp=4 and divide dp_shard*cp=4",
            "valid ep: [4]",
        ],
        id="etp=tp-ep-not-multiple-of-cp",
    ),
    pytest.param(
        dict(world_size=8, dp_shard=2, cp=2, tp=2, ep=3, etp=2),
        ["ep=3 does not fit the mesh", "etp == tp", "multiple of cp=2 and divide dp_shard*cp=4", "valid ep: [2, 4]"],
        id="etp=tp-ep3",
    ),
    pytest.param(
        dict(world_size=8, dp_shard=2, cp=2, tp=2, ep=8, etp=2),
        ["ep=8 does not fit the mesh", "etp == tp", "divide dp_shard*cp=4", "valid ep: [2, 4]"],
        id="etp=tp-ep-does-not-divide-pool",
    ),
    pytest.param(
        dict(world_size=8, dp_replicate=2, cp=2, tp=2, ep=4, etp=2),
        ["ep=4 does not fit the mesh", "etp == tp", "multiple of cp=2 and divide dp_shard*cp=2", "valid ep: [2]"],
        id="etp=tp-dp_replicate-not-borrowed",
    ),
    pytest.param(
        dict(world_size=8, ep=3),
        ["ep=3 does not fit the mesh", "etp == tp", "multiple of cp=1 and divide dp_shard*cp=8", "valid ep: [2, 4, 8]"],
        id="tp1-ep3",
    ),
    pytest.param(
        dict(world_size=8, tp=8, ep=2, etp=8),
        [
            "ep=2 does not fit the mesh",
            "etp == tp",
            "divide dp_shard*cp=1",
            "no ep > 1 fits these degrees with etp=8",
            "valid (ep, etp) with etp=1: [(8, 1)]",
        ],
        id="etp=tp-no-ep-fits",
    ),
    # --- etp == 1 (tp > 1): ep % (cp*tp) == 0 and (dp_shard*cp*tp) % ep == 0 ---
    pytest.param(
        dict(world_size=8, dp_shard=2, cp=2, tp=2, ep=2, etp=1),
        [
            "ep=2 does not fit the mesh",
            "etp == 1: EP borrows all of cp*tp and part of dp_shard",
            "ep must be a multiple of cp*tp=4 and divide dp_shard*cp*tp=8",
            "valid ep: [4, 8]",
        ],
        id="etp1-ep-not-multiple-of-cp*tp",
    ),
    pytest.param(
        dict(world_size=8, tp=4, ep=2),
        [
            "ep=2 does not fit the mesh",
            "etp == 1",
            "multiple of cp*tp=4 and divide dp_shard*cp*tp=8",
            "valid ep: [4, 8]",
        ],
        id="etp1-tp4-ep2",
    ),
    pytest.param(
        dict(world_size=8, dp_replicate=2, dp_shard=2, tp=2, ep=8, etp=1),
        [
            "ep=8 does not fit the mesh",
            "etp == 1",
            "multiple of cp*tp=2 and divide dp_shard*cp*tp=4",
            "valid ep: [2, 4]",
        ],
        id="etp1-ep-does-not-divide-pool",
    ),
    pytest.param(
        dict(world_size=16, dp_replicate=2, dp_shard=2, cp=2, tp=2, ep=16, etp=1),
        ["ep=16 does not fit the mesh", "etp == 1", "divide dp_shard*cp*tp=8", "valid ep: [4, 8]"],
        id="etp1-ep16",
    ),
    pytest.param(
        dict(world_size=8, tp=2, ep=6, etp=1),
        [
            "ep=6 does not fit the mesh",
            "etp == 1",
            "multiple of cp*tp=2 and divide dp_shard*cp*tp=8",
            "valid ep: [2, 4, 8]",
        ],
        id="etp1-ep6",
    ),
    # --- bad types ---
    pytest.param(dict(world_size=8.0), ["world_size must be an integer, got 8.0"], id="float-world"),
    pytest.param(dict(world_size=8, tp="2"), ["tp must be an integer, got '2'"], id="str-tp"),
    pytest.param(dict(world_size=8, cp=True), ["cp must be an integer, got True"], id="bool-cp"),
    pytest.param(dict(world_size=8, etp=False), ["etp must be an integer, got False"], id="bool-etp"),
    pytest.param(dict(world_size=True), ["world_size must be an integer, got True"], id="bool-world"),
    pytest.param(dict(world_size=8, ep=2.5), ["ep must be an integer, got 2.5"], id="float-ep"),
    pytest.param(dict(world_size=8, dp_shard=None), ["dp_shard must be an integer, got None"], id="none-dp_shard"),
    # --- zero / negative degrees ---
    pytest.param(dict(world_size=0), ["world_size must be >= 1, got world_size=0"], id="zero-world"),
    pytest.param(dict(world_size=-8), ["world_size must be >= 1, got world_size=-8"], id="negative-world"),
    pytest.param(dict(world_size=8, tp=0), ["tp must be >= 1, got tp=0"], id="zero-tp"),
    pytest.param(dict(world_size=8, cp=-1), ["cp must be >= 1, got cp=-1"], id="minus-one-cp"),
    pytest.param(
        dict(world_size=8, dp_replicate=0), ["dp_replicate must be >= 1, got dp_replicate=0"], id="zero-dp_replicate"
    ),
    pytest.param(
        dict(world_size=8, dp_shard=0),
        ["dp_shard must be >= 1 (or -1 to infer it), got dp_shard=0"],
        id="zero-dp_shard",
    ),
    pytest.param(
        dict(world_size=8, dp_shard=-2),
        ["dp_shard must be >= 1 (or -1 to infer it), got dp_shard=-2"],
        id="minus-two-dp_shard",
    ),
    pytest.param(dict(world_size=8, pp=0), ["pp must be >= 1, got pp=0"], id="zero-pp"),
    pytest.param(dict(world_size=8, ep=0), ["ep must be >= 1, got ep=0"], id="zero-ep"),
]


def _check_hints(kwargs: dict, message: str) -> None:
    """Every hinted choice in ``message`` must itself construct a valid ParallelDims."""
    m = re.search(r"nearest valid choice: dp_shard=(\d+)", message)
    if m:
        ParallelDims(**{**kwargs, "dp_shard": int(m.group(1))})
        assert "(or dp_shard=-1)" in message
        ParallelDims(**{**kwargs, "dp_shard": -1})
    m = re.search(r"nearest valid world_size: (\d+)", message)
    if m:
        # the hinted world_size works with the other degrees once dp_shard is inferred again
        hinted = int(m.group(1))
        assert hinted % 1 == 0 and hinted >= 1
        dims = ParallelDims(**{**kwargs, "world_size": hinted, "dp_shard": -1})
        assert dims.world_size == hinted
    m = re.search(r"valid ep: \[([\d, ]+)\]", message)
    if m:
        listed = [int(x) for x in m.group(1).split(",")]
        for ep in listed:
            ParallelDims(**{**kwargs, "ep": ep})
        # and the list is complete: no other ep > 1 fits (same etp)
        brute = [ep for ep in range(2, 2 * kwargs["world_size"] + 1) if _is_valid(**{**kwargs, "ep": ep})]
        assert listed == brute
    if "no ep > 1 fits these degrees" in message:
        assert not any(_is_valid(**{**kwargs, "ep": ep}) for ep in range(2, 2 * kwargs["world_size"] + 1))
    m = re.search(r"valid \(ep, etp\) with etp=\d+: (\[.*\])", message)
    if m:
        for ep, etp in ast.literal_eval(m.group(1)):
            ParallelDims(**{**kwargs, "ep": ep, "etp": etp})
    if "requires ep > 1" in message and "set etp=1" in message:
        ParallelDims(**{**kwargs, "etp": 1})


@pytest.mark.parametrize("kwargs, fragments", INVALID)
def test_invalid_degrees_raise_with_their_own_message(kwargs, fragments):
    with pytest.raises(ValueError) as info:
        ParallelDims(**kwargs)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    _check_hints(kwargs, message)


def test_invalid_case_count_and_rule_coverage():
    assert len(INVALID) >= 30
    rules = [
        "world-size equation violated",
        "cannot infer dp_shard",
        "requires ep > 1",
        "must be 1 or equal to tp",
        "etp == tp",
        "etp == 1",
        "must be an integer",
        "must be >= 1",
    ]
    for rule in rules:
        assert sum(any(rule in f for f in p.values[1]) for p in INVALID) >= 2, rule


def test_minus_one_hint_only_for_dp_shard():
    with pytest.raises(ValueError) as info:
        ParallelDims(world_size=8, cp=-1)
    assert "(or -1" not in str(info.value)


def test_pp_is_the_outermost_dim_of_every_view():
    """pp=2, dp_shard=2, tp=2 on 8 ranks, by hand: stage s holds the contiguous ranks 4s..4s+3, so the pp
    groups pair rank r with r+4; inside a stage the mesh is the pp=1 mesh of 4 ranks shifted by 4s."""
    dims = ParallelDims(world_size=8, pp=2, dp_shard=2, tp=2)
    assert all(view[0] == ("pp", 2) for view in dims.views().values())
    assert dims.group_ranks("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.group_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.group_ranks("fsdp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.coordinates(6)["pp"] == 1 and dims.coordinates(6)["dp"] == 1
    sparse = ParallelDims(world_size=8, pp=2, dp_shard=4, ep=2).views()["sparse"]
    assert sparse == (("pp", 2), ("dp_replicate", 1), ("efsdp", 2), ("ep", 2))
    assert "pp" not in dict(ParallelDims(world_size=8).views()["dense"])  # pp=1 views unchanged


@pytest.mark.parametrize(
    "dims_kwargs, model, fragments",
    [
        (
            dict(world_size=4, pp=2),
            dict(n_layers=3),
            [
                "n_layers=3 must be divisible by pp*stages_per_rank = 2*1 = 2",
                "valid pp for 3 layers: [3]",
                "nearest valid n_layers: 4",
            ],
        ),
        (
            dict(world_size=4, pp=2),
            dict(n_layers=4, stages_per_rank=4),
            ["n_layers=4 must be divisible by pp*stages_per_rank = 2*4 = 8", "nearest valid n_layers: 8"],
        ),
        (
            dict(world_size=8, pp=4),
            dict(n_layers=8, microbatches=2),
            ["microbatches=2 must be >= the number of stages pp*stages_per_rank = 4"],
        ),
        (
            dict(world_size=4, pp=2, dp_shard=2),
            dict(n_layers=4, microbatches=3, global_batch=8),
            [
                "each data-parallel rank's 4 rows (global_batch=8 / dp=2) must split into microbatches=3",
                "valid microbatches: [2, 4]",
            ],
        ),
    ],
)
def test_pipeline_model_rules(dims_kwargs, model, fragments):
    """Each pipeline rule raises with its numbers; the suggested fix (first valid value) passes."""
    dims = ParallelDims(**dims_kwargs)
    with pytest.raises(ValueError) as info:
        dims.check_model(**model)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    if "nearest valid n_layers" in str(info.value):
        dims.check_model(**{**model, "n_layers": int(str(info.value).rsplit(": ", 1)[1])})
    if "valid microbatches" in str(info.value):
        dims.check_model(**{**model, "microbatches": 4})


def test_etp_requires_ep_is_checked_before_etp_in_1_tp():
    # etp=2 with tp=1 violates both rules; the ep rule is the one reported
    with pytest.raises(ValueError, match=r"etp=2 requires ep > 1"):
        ParallelDims(world_size=8, etp=2)


# --------------------------------------------------------------------------------------------
# 2. check_model shape rules
# --------------------------------------------------------------------------------------------

# (dims kwargs, check_model kwargs, expected fragments or None for "accepted", hinted kwargs or None)
D_CP = dict(world_size=8, dp_shard=2, cp=2, tp=2, ep=2, etp=2)  # tp*2*cp = 8, dp = 2, ep = 2, etp = 2
D_CP_TP1 = dict(world_size=4, cp=2)  # tp*2*cp = 4
D_HSDP_TP = dict(world_size=8, dp_replicate=2, tp=2)  # dp_shard = 2, dp = 4, cp = 1
D_TP4 = dict(world_size=8, tp=4)  # dp_shard = 2, dp = 2
D_EP_ETP1 = dict(world_size=8, dp_shard=2, cp=2, tp=2, ep=4, etp=1)
D_64 = dict(world_size=64, dp_replicate=2, dp_shard=4, cp=2, tp=4, ep=8, etp=1)  # dp = 8

CHECK_MODEL = [
    # seq_len % (tp*2*cp) with cp > 1
    pytest.param(
        D_CP,
        dict(seq_len=12),
        ["seq_len=12 must be divisible by tp*2*cp = 2*2*2 = 8", "nearest valid seq_len: 16"],
        dict(seq_len=16),
        id="cp-seq12",
    ),
    pytest.param(
        D_CP,
        dict(seq_len=4),
        ["seq_len=4 must be divisible by tp*2*cp = 2*2*2 = 8", "nearest valid seq_len: 8"],
        dict(seq_len=8),
        id="cp-seq4-not-lcm",
    ),
    pytest.param(
        D_CP,
        dict(seq_len=13, sequence_parallel=True),
        ["seq_len=13", "= 8", "nearest valid seq_len: 16"],
        dict(seq_len=16, sequence_parallel=True),
        id="cp-seq13-sp",
    ),
    pytest.param(D_CP, dict(seq_len=16), None, None, id="cp-seq16-ok"),
    pytest.param(D_CP, dict(seq_len=24, sequence_parallel=True), None, None, id="cp-seq24-sp-ok"),
    pytest.param(
        D_CP_TP1,
        dict(seq_len=6),
        ["seq_len=6 must be divisible by tp*2*cp = 1*2*2 = 4", "nearest valid seq_len: 8"],
        dict(seq_len=8),
        id="cp-tp1-seq6",
    ),
    pytest.param(D_CP_TP1, dict(seq_len=4), None, None, id="cp-tp1-seq4-ok"),
    # seq_len % tp with sequence parallelism and cp == 1
    pytest.param(
        D_HSDP_TP,
        dict(seq_len=7, sequence_parallel=True),
        ["seq_len=7 must be divisible by tp=2 with sequence parallelism", "nearest valid seq_len: 8"],
        dict(seq_len=8, sequence_parallel=True),
        id="sp-seq7",
    ),
    pytest.param(D_HSDP_TP, dict(seq_len=7), None, None, id="no-sp-seq7-ok"),
    pytest.param(D_HSDP_TP, dict(seq_len=8, sequence_parallel=True), None, None, id="sp-seq8-ok"),
    pytest.param(
        D_TP4,
        dict(seq_len=10, sequence_parallel=True),
        ["seq_len=10 must be divisible by tp=4 with sequence parallelism", "nearest valid seq_len: 12"],
        dict(seq_len=12, sequence_parallel=True),
        id="sp-tp4-seq10",
    ),
    pytest.param(
        D_TP4,
        dict(seq_len=9, sequence_parallel=True),
        ["seq_len=9", "tp=4", "nearest valid seq_len: 8"],
        dict(seq_len=8, sequence_parallel=True),
        id="sp-tp4-seq9",
    ),
    # num_experts % ep
    pytest.param(D_CP, dict(num_experts=3), ["num_experts=3 must be divisible by ep=2"], None, id="experts3-ep2"),
    pytest.param(D_CP, dict(num_experts=4), None, None, id="experts4-ep2-ok"),
    pytest.param(D_64, dict(num_experts=12), ["num_experts=12 must be divisible by ep=8"], None, id="experts12-ep8"),
    pytest.param(D_64, dict(num_experts=16), None, None, id="experts16-ep8-ok"),
    # num_heads % tp
    pytest.param(D_TP4, dict(num_heads=6), ["num_heads=6 must be divisible by tp=4"], None, id="heads6-tp4"),
    pytest.param(D_TP4, dict(num_heads=8), None, None, id="heads8-tp4-ok"),
    # hidden % tp
    pytest.param(
        D_TP4,
        dict(hidden_sizes=(64, 30)),
        ["hidden size 30 must be divisible by tp=4", "nearest valid size: 32"],
        dict(hidden_sizes=(64, 32)),
        id="hidden30-tp4",
    ),
    pytest.param(D_TP4, dict(hidden_sizes=(64, 32, 128)), None, None, id="hidden-tp4-ok"),
    pytest.param(
        D_EP_ETP1,
        dict(hidden_sizes=(33,)),
        ["hidden size 33 must be divisible by tp=2", "nearest valid size: 34"],
        dict(hidden_sizes=(34,)),
        id="hidden33-tp2",
    ),
    # expert hidden % etp
    pytest.param(
        D_CP,
        dict(expert_hidden_sizes=(33,)),
        ["hidden size 33 must be divisible by etp=2", "nearest valid size: 34"],
        dict(expert_hidden_sizes=(34,)),
        id="expert-hidden33-etp2",
    ),
    pytest.param(D_EP_ETP1, dict(expert_hidden_sizes=(33,)), None, None, id="expert-hidden33-etp1-ok"),
    # global_batch % dp (dp = dp_replicate*dp_shard; cp does not enter)
    pytest.param(
        D_HSDP_TP,
        dict(global_batch=6),
        ["global_batch=6 must be divisible by dp = dp_replicate*dp_shard = 4", "nearest valid global_batch: 8"],
        dict(global_batch=8),
        id="batch6-dp4",
    ),
    pytest.param(D_HSDP_TP, dict(global_batch=8), None, None, id="batch8-dp4-ok"),
    pytest.param(D_CP, dict(global_batch=6), None, None, id="batch6-dp2-cp-ignored-ok"),
    pytest.param(
        D_64,
        dict(global_batch=12),
        ["global_batch=12 must be divisible by dp = dp_replicate*dp_shard = 8", "nearest valid global_batch: 16"],
        dict(global_batch=16),
        id="batch12-dp8",
    ),
    # everything at once, all fine
    pytest.param(
        D_CP,
        dict(
            seq_len=64,
            sequence_parallel=True,
            global_batch=4,
            num_experts=8,
            num_heads=4,
            hidden_sizes=(32, 64),
            expert_hidden_sizes=(16,),
        ),
        None,
        None,
        id="all-ok",
    ),
]


@pytest.mark.parametrize("dims_kwargs, model, fragments, hinted", CHECK_MODEL)
def test_check_model(dims_kwargs, model, fragments, hinted):
    dims = ParallelDims(**dims_kwargs)
    if fragments is None:
        dims.check_model(**model)
        return
    with pytest.raises(ValueError) as info:
        dims.check_model(**model)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    if hinted is not None:
        dims.check_model(**hinted)


# --------------------------------------------------------------------------------------------
# 3. valid combinations and their derived degrees (computed by hand from the rules of docs/design.md §2)
#    fsdp = dp_shard*cp, dp = dp_replicate*dp_shard, dp_cp = dp_replicate*dp_shard*cp,
#    efsdp = dp_shard*cp*tp // (ep*etp); dp_shard=-1 -> world_size // (dp_replicate*cp*tp*pp)
# --------------------------------------------------------------------------------------------

VALID = [
    # kwargs                                                          dp_shard fsdp dp dp_cp efsdp
    pytest.param(dict(world_size=1), (1, 1, 1, 1, 1), id="ws1"),
    pytest.param(dict(world_size=8), (8, 8, 8, 8, 8), id="fsdp8"),
    pytest.param(dict(world_size=8, tp=2), (4, 4, 4, 4, 8), id="fsdp4-tp2"),
    pytest.param(dict(world_size=8, dp_replicate=2, tp=2), (2, 2, 4, 4, 4), id="hsdp-tp"),
    pytest.param(dict(world_size=8, dp_shard=2, cp=2, tp=2, ep=2, etp=2), (2, 4, 2, 4, 2), id="C-grid"),
    pytest.param(dict(world_size=8, cp=2, tp=2, ep=4), (2, 4, 2, 4, 2), id="ep4-etp1"),
    pytest.param(dict(world_size=8, cp=2, tp=2, ep=8), (2, 4, 2, 4, 1), id="ep8-etp1"),
    pytest.param(dict(world_size=8, cp=4, tp=2, ep=4, etp=2), (1, 4, 1, 4, 1), id="cp4-ep4-etp2"),
    pytest.param(dict(world_size=8, tp=8), (1, 1, 1, 1, 8), id="pure-tp8"),
    pytest.param(dict(world_size=8, tp=8, ep=8), (1, 1, 1, 1, 1), id="tp8-ep8"),
    pytest.param(dict(world_size=8, dp_shard=8, ep=8), (8, 8, 8, 8, 1), id="fsdp8-ep8"),
    pytest.param(dict(world_size=8, dp_replicate=2, tp=2, ep=2, etp=2), (2, 2, 4, 4, 1), id="hsdp-ep2-etp2"),
    pytest.param(dict(world_size=8, dp_replicate=2, tp=2, ep=4), (2, 2, 4, 4, 1), id="hsdp-ep4-etp1"),
    pytest.param(dict(world_size=12, dp_replicate=3, tp=2), (2, 2, 6, 6, 4), id="ws12"),
    pytest.param(dict(world_size=6, cp=3), (2, 6, 2, 6, 6), id="cp3"),
    pytest.param(dict(world_size=16, dp_replicate=4), (4, 4, 16, 16, 4), id="ddp4x4"),
    pytest.param(dict(world_size=8, pp=1, dp_shard=-1, cp=2), (4, 8, 4, 8, 8), id="explicit-pp1"),
    pytest.param(
        dict(world_size=64, dp_replicate=2, dp_shard=4, cp=2, tp=4, ep=4, etp=4), (4, 8, 8, 16, 2), id="64-ep4-etp4"
    ),
    pytest.param(dict(world_size=64, dp_replicate=2, cp=2, tp=4, ep=16), (4, 8, 8, 16, 2), id="64-ep16-etp1"),
    pytest.param(dict(world_size=64, dp_replicate=2, cp=2, tp=4, ep=8), (4, 8, 8, 16, 4), id="64-ep8-etp1"),
]


@pytest.mark.parametrize("kwargs, expected", VALID)
def test_valid_degrees_and_derived(kwargs, expected):
    dims = ParallelDims(**kwargs)
    dp_shard, fsdp, dp, dp_cp, efsdp = expected
    assert (dims.dp_shard, dims.fsdp, dims.dp, dims.dp_cp, dims.efsdp) == (dp_shard, fsdp, dp, dp_cp, efsdp)
    assert dims.pp == 1
    # the inferred dp_shard, given explicitly, describes the same run
    assert ParallelDims(**{**kwargs, "dp_shard": dp_shard}) == dims
    degrees = dims.degrees()
    assert degrees["dp_shard"] == dp_shard and degrees["world_size"] == kwargs["world_size"]
    assert set(degrees) == {"world_size", *DEGREES}
    # every view multiplies to world_size
    for name, view in dims.views().items():
        product = 1
        for _, size in view:
            product *= size
        assert product == dims.world_size, name


def test_replace_revalidates():
    dims = ParallelDims(world_size=8, tp=2)
    assert dims.replace(tp=4, dp_shard=-1).dp_shard == 2
    with pytest.raises(ValueError, match="world-size equation violated"):
        dims.replace(tp=4)  # dp_shard stays 4 -> 1*4*1*4*1 = 16 != 8


# --------------------------------------------------------------------------------------------
# 4. group rank lists from ParallelDims.group_ranks, against hand-derived lists
# --------------------------------------------------------------------------------------------

# Layout A: (dp_replicate, dp_shard, cp, tp) = (1, 2, 2, 2), ep = 2, etp = 2 ->
#   rank = (s*2 + c)*2 + t; efsdp = 2*2*2 // (2*2) = 2; sparse view (1, efsdp=2, ep=2, etp=2)
LAYOUT_A = dict(world_size=8, dp_shard=2, cp=2, tp=2, ep=2, etp=2)
GROUPS_A = {
    "dp_replicate": [[0], [1], [2], [3], [4], [5], [6], [7]],
    "dp_shard": [[0, 4], [1, 5], [2, 6], [3, 7]],
    "cp": [[0, 2], [1, 3], [4, 6], [5, 7]],
    "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
    "fsdp": [[0, 2, 4, 6], [1, 3, 5, 7]],
    "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
    "dp_cp": [[0, 2, 4, 6], [1, 3, 5, 7]],
    "efsdp": [[0, 4], [1, 5], [2, 6], [3, 7]],
    "ep": [[0, 2], [1, 3], [4, 6], [5, 7]],
    "etp": [[0, 1], [2, 3], [4, 5], [6, 7]],
}

# Layout B: dp_replicate = 2, tp = 2, dp_shard = 2 (inferred), ep = etp = 1 ->
#   rank = (r*2 + s)*2 + t; efsdp = 2*1*2 // 1 = 4; sparse view (2, efsdp=4, ep=1), no etp dim
LAYOUT_B = dict(world_size=8, dp_replicate=2, tp=2)
GROUPS_B = {
    "dp_replicate": [[0, 4], [1, 5], [2, 6], [3, 7]],
    "dp_shard": [[0, 2], [1, 3], [4, 6], [5, 7]],
    "cp": [[0], [1], [2], [3], [4], [5], [6], [7]],
    "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
    "fsdp": [[0, 2], [1, 3], [4, 6], [5, 7]],
    "dp": [[0, 2, 4, 6], [1, 3, 5, 7]],
    "dp_cp": [[0, 2, 4, 6], [1, 3, 5, 7]],
}
# ep = 1: no sparse view, so no efsdp / ep / etp groups

# Layout B2: same dense dims, ep = 4, etp = 1 (EP borrows all of tp and all of dp_shard):
#   efsdp = 2*1*2 // 4 = 1; sparse view (2, efsdp=1, ep=4)
LAYOUT_B2 = dict(world_size=8, dp_replicate=2, tp=2, ep=4)
GROUPS_B2 = {**GROUPS_B, "efsdp": [[0], [1], [2], [3], [4], [5], [6], [7]], "ep": [[0, 1, 2, 3], [4, 5, 6, 7]]}

# Layout B3: same dense dims, ep = 2, etp = tp = 2 (EP borrows dp_shard): efsdp = 2*1*2 // 4 = 1;
#   sparse view (2, efsdp=1, ep=2, etp=2)
LAYOUT_B3 = dict(world_size=8, dp_replicate=2, tp=2, ep=2, etp=2)
GROUPS_B3 = {
    **GROUPS_B,
    "efsdp": [[0], [1], [2], [3], [4], [5], [6], [7]],
    "ep": [[0, 2], [1, 3], [4, 6], [5, 7]],
    "etp": [[0, 1], [2, 3], [4, 5], [6, 7]],
}


def _groups_64(ep: int, etp: int) -> dict[str, list[list[int]]]:
    """Hand derivation for (dp_replicate, dp_shard, cp, tp) = (2, 4, 2, 4) on 64 ranks.

    rank = ((r*DS + s)*CP + c)*TP + t with DS=4, CP=2, TP=4, so: tp groups are 4 consecutive ranks,
    the cp partner of a rank is rank+4 (or rank-4), dp_shard peers are 8 apart, the dp_replicate partner
    is rank+32 (or rank-32). A group of a dim holds every rank whose other coordinates are fixed.
    For the sparse (expert) dims dp_shard is split as s = s_hi*2 + s_lo (s_lo the inner half):
      etp == tp == 4, ep == 4 : EP borrows all of cp and the inner part of dp_shard: ep varies (s_lo, c),
                                etp varies t (= the tp groups), efsdp varies s_hi (2 = 4*2*4 // (4*4));
      etp == 1, ep == 16      : EP borrows cp*tp and the inner part of dp_shard: ep varies (s_lo, c, t)
                                (16 consecutive ranks), efsdp varies s_hi (2 = 32 // 16);
      etp == 1, ep == 8       : EP borrows exactly cp*tp: ep varies (c, t) (8 consecutive ranks),
                                efsdp varies all of s (4 = 32 // 8), i.e. the dp_shard groups.
    """
    R, DS, CP, TP = 2, 4, 2, 4

    def rank(r, s, c, t):
        return ((r * DS + s) * CP + c) * TP + t

    g = {
        "dp_replicate": [[rank(r, s, c, t) for r in range(R)] for s in range(DS) for c in range(CP) for t in range(TP)],
        "dp_shard": [[rank(r, s, c, t) for s in range(DS)] for r in range(R) for c in range(CP) for t in range(TP)],
        "cp": [[rank(r, s, c, t) for c in range(CP)] for r in range(R) for s in range(DS) for t in range(TP)],
        "tp": [[rank(r, s, c, t) for t in range(TP)] for r in range(R) for s in range(DS) for c in range(CP)],
        # fsdp = dp_shard*cp: fixed (r, t), vary (s, c)
        "fsdp": [[rank(r, s, c, t) for s in range(DS) for c in range(CP)] for r in range(R) for t in range(TP)],
        # dp = dp_replicate*dp_shard: fixed (c, t), vary (r, s)
        "dp": [[rank(r, s, c, t) for r in range(R) for s in range(DS)] for c in range(CP) for t in range(TP)],
        # dp_cp: fixed t, vary (r, s, c)
        "dp_cp": [[rank(r, s, c, t) for r in range(R) for s in range(DS) for c in range(CP)] for t in range(TP)],
    }
    if (ep, etp) == (4, 4):
        g["ep"] = [
            [rank(r, 2 * s_hi + s_lo, c, t) for s_lo in range(2) for c in range(CP)]
            for r in range(R)
            for s_hi in range(2)
            for t in range(TP)
        ]
        g["efsdp"] = [
            [rank(r, 2 * s_hi + s_lo, c, t) for s_hi in range(2)]
            for r in range(R)
            for s_lo in range(2)
            for c in range(CP)
            for t in range(TP)
        ]
        g["etp"] = g["tp"]
    elif (ep, etp) == (16, 1):
        g["ep"] = [
            [rank(r, 2 * s_hi + s_lo, c, t) for s_lo in range(2) for c in range(CP) for t in range(TP)]
            for r in range(R)
            for s_hi in range(2)
        ]
        g["efsdp"] = [
            [rank(r, 2 * s_hi + s_lo, c, t) for s_hi in range(2)]
            for r in range(R)
            for s_lo in range(2)
            for c in range(CP)
            for t in range(TP)
        ]
    elif (ep, etp) == (8, 1):
        g["ep"] = [[rank(r, s, c, t) for c in range(CP) for t in range(TP)] for r in range(R) for s in range(DS)]
        g["efsdp"] = g["dp_shard"]
    else:
        raise AssertionError("no hand derivation for this ep/etp")
    return g


LAYOUTS_64 = [(4, 4), (16, 1), (8, 1)]


def _layout_64(ep, etp):
    return dict(world_size=64, dp_replicate=2, dp_shard=4, cp=2, tp=4, ep=ep, etp=etp)


LAYOUTS = [
    pytest.param(LAYOUT_A, GROUPS_A, id="8-A-(1,2,2,2)-ep2-etp2"),
    pytest.param(LAYOUT_B, GROUPS_B, id="8-B-hsdp-tp-ep1"),
    pytest.param(LAYOUT_B2, GROUPS_B2, id="8-B2-ep4-etp1"),
    pytest.param(LAYOUT_B3, GROUPS_B3, id="8-B3-ep2-etp2"),
] + [pytest.param(_layout_64(ep, etp), _groups_64(ep, etp), id=f"64-ep{ep}-etp{etp}") for ep, etp in LAYOUTS_64]


def test_hand_derivation_64_sanity():
    g = _groups_64(4, 4)
    assert g["tp"][0] == [0, 1, 2, 3] and g["tp"][-1] == [60, 61, 62, 63]
    assert [0, 4] in g["cp"] and [33, 37] in g["cp"]
    assert [1, 9, 17, 25] in g["dp_shard"]
    assert [5, 37] in g["dp_replicate"]
    assert [0, 4, 8, 12] in g["ep"] and [16, 20, 24, 28] in g["ep"]  # s_lo in {0,1}, c in {0,1}
    assert [0, 16] in g["efsdp"]
    assert _groups_64(16, 1)["ep"][0] == list(range(16))
    assert _groups_64(8, 1)["ep"][1] == list(range(8, 16))


@pytest.mark.parametrize("kwargs, expected", LAYOUTS)
def test_group_ranks_match_hand_derivation(kwargs, expected):
    dims = ParallelDims(**kwargs)
    for dim in ALL_DIMS:
        if dim not in expected:
            # etp == 1: the sparse view has no etp dim (docs/design.md §2: (dp_replicate, efsdp, ep[, etp]));
            # ep == 1: there is no sparse view at all
            assert dims.etp == 1 and (dim == "etp" or dims.ep == 1)
            with pytest.raises(ValueError, match=rf"there is no '{dim}' dim"):
                dims.group_ranks(dim)
            continue
        got = dims.group_ranks(dim)
        assert all(group == sorted(group) for group in got), dim
        assert _norm(got) == _norm(expected[dim]), dim
        # groups partition the world, each of the size of the dim
        flat = sorted(r for group in got for r in group)
        assert flat == list(range(dims.world_size)), dim
        size = {"fsdp": dims.fsdp, "dp": dims.dp, "dp_cp": dims.dp_cp, "efsdp": dims.efsdp}.get(dim)
        size = getattr(dims, dim) if size is None else size
        assert {len(group) for group in got} == {size}, dim
        for rank in (0, dims.world_size - 1):
            assert rank in dims.group_of(dim, rank)


def test_group_of_and_unknown_dim():
    dims = ParallelDims(**LAYOUT_A)
    assert dims.group_of("cp", 5) == [5, 7]
    assert dims.group_of("fsdp", 3) == [1, 3, 5, 7]
    with pytest.raises(ValueError, match=r"rank 8 is outside world_size=8"):
        dims.group_of("tp", 8)
    with pytest.raises(ValueError, match=r"rank -1 is outside world_size=8"):
        dims.group_of("tp", -1)
    with pytest.raises(ValueError, match=r"unknown mesh dim 'pp'"):  # pp=1: no pp dim
        dims.group_ranks("pp")
    with pytest.raises(ValueError, match=r"unknown mesh dim 'foo'"):
        dims.group_ranks("foo")


# --------------------------------------------------------------------------------------------
# 5. the same lists read from real DeviceMeshes (fake process-group backend, one process)
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _rank_cases():
    for param in LAYOUTS:
        kwargs, expected = param.values
        world = kwargs["world_size"]
        for rank in (0, 5, world - 1):
            yield pytest.param(kwargs, expected, rank, id=f"{param.id}-rank{rank}")


@pytest.mark.parametrize("kwargs, expected, rank", list(_rank_cases()))
def test_device_mesh_groups(kwargs, expected, rank):
    dims = ParallelDims(**kwargs)
    with fake_process_group(dims.world_size, rank) as dist:
        views = build_mesh(dims, "cpu")
        for dim in ALL_DIMS:
            if dim not in expected:
                with pytest.raises(ValueError, match=r"unknown mesh dim"):
                    views.all_group_ranks(dim)
                continue
            if dims.ep == 1 and dim in ("ep", "efsdp"):
                # no sparse mesh is built without EP
                with pytest.raises(ValueError):
                    views.all_group_ranks(dim)
                with pytest.raises(ValueError):
                    views[dim]
                continue
            from_mesh = views.all_group_ranks(dim)
            assert _norm(from_mesh) == _norm(dims.group_ranks(dim)) == _norm(expected[dim]), dim
            # and the process group this rank actually got on that dim is its hand-derived group
            mine = next(group for group in expected[dim] if rank in group)
            assert dist.get_process_group_ranks(views[dim].get_group()) == sorted(mine), dim

        # the dense view has every dim, even at size 1
        assert views.dense.mesh_dim_names == ("dp_replicate", "dp_shard", "cp", "tp")
        assert tuple(views.dense.shape) == (dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp)

        # HSDP mesh (dp_replicate, fsdp): the ranks sharing this rank's tp coordinate
        hsdp = views["dp_replicate", "fsdp"]
        assert hsdp.mesh_dim_names == ("dp_replicate", "fsdp")
        assert tuple(hsdp.shape) == (dims.dp_replicate, dims.fsdp)
        assert sorted(hsdp.mesh.flatten().tolist()) == sorted(next(g for g in expected["dp_cp"] if rank in g))
        # (fsdp, tp): the ranks sharing this rank's dp_replicate coordinate
        fsdp_tp = views["fsdp", "tp"]
        assert fsdp_tp.mesh_dim_names == ("fsdp", "tp")
        assert tuple(fsdp_tp.shape) == (dims.fsdp, dims.tp)
        block = dims.world_size // dims.dp_replicate
        start = rank // block * block
        assert sorted(fsdp_tp.mesh.flatten().tolist()) == list(range(start, start + block))

        if dims.ep > 1:
            ep_mesh = views["ep"]
            assert ep_mesh.mesh_dim_names == ("ep",)
            assert ep_mesh.size() == dims.ep
            assert sorted(ep_mesh.mesh.tolist()) == next(g for g in expected["ep"] if rank in g)
            assert views.sparse.mesh_dim_names == (
                ("dp_replicate", "efsdp", "ep", "etp") if dims.etp > 1 else ("dp_replicate", "efsdp", "ep")
            )
        else:
            with pytest.raises(ValueError, match=r"no sparse \(expert\) mesh: ep=1"):
                _ = views.sparse

        # unknown dims, and dims of one view in the wrong order
        with pytest.raises(ValueError, match=r"no view has the dims \('foo',\)"):
            views["foo"]
        with pytest.raises(ValueError, match=r"no view has the dims \('dp_replicate', 'foo'\)"):
            views["dp_replicate", "foo"]
        with pytest.raises(ValueError, match=r"in this order"):
            views["tp", "fsdp"]
        with pytest.raises(ValueError, match=r"no view has the dims"):
            views["ep", "tp"]  # ep and tp live in different views
        with pytest.raises(ValueError, match=r"unknown mesh dim 'foo'"):
            views.all_group_ranks("foo")


def test_build_mesh_needs_matching_process_group():
    import torch.distributed as dist

    dims = ParallelDims(**LAYOUT_A)
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        build_mesh(dims, "cpu")
    with (
        fake_process_group(4, 0),
        pytest.raises(ValueError, match=r"the process group has 4 ranks but ParallelDims.world_size=8"),
    ):
        build_mesh(dims, "cpu")


# --------------------------------------------------------------------------------------------
# valid_choices
# --------------------------------------------------------------------------------------------


def _key(dims: ParallelDims):
    return tuple(getattr(dims, n) for n in ("world_size",) + DEGREES)


def test_valid_choices_8():
    choices = valid_choices(8)
    keys = [_key(d) for d in choices]
    assert len(keys) == len(set(keys)), "duplicates"
    for dims in choices:
        assert isinstance(dims, ParallelDims) and dims.world_size == 8 and dims.pp == 1
        # valid: rebuilding from its own degrees succeeds and gives the same object
        assert ParallelDims(**dims.degrees()) == dims
    for layout in (LAYOUT_A, LAYOUT_B, LAYOUT_B2, LAYOUT_B3):
        assert ParallelDims(**layout) in choices
    # complete: exactly the combinations the constructor accepts (brute force over small degrees)
    brute = set()
    for dp_replicate, dp_shard, cp, tp in itertools.product((1, 2, 4, 8), repeat=4):
        for ep, etp in itertools.product(range(1, 9), range(1, 9)):
            kw = dict(world_size=8, dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, ep=ep, etp=etp)
            if _is_valid(**kw):
                brute.add(_key(ParallelDims(**kw)))
    assert set(keys) == brute


def test_valid_choices_2_literal():
    # (dp_replicate, dp_shard, cp, tp, ep, etp), enumerated by hand for 2 ranks:
    # tp=2 with ep=2 needs etp=1 (etp=tp=2 would need dp_shard*cp=1 divisible by ep=2)
    expected = {
        (1, 2, 1, 1, 1, 1),
        (1, 2, 1, 1, 2, 1),
        (2, 1, 1, 1, 1, 1),
        (1, 1, 2, 1, 1, 1),
        (1, 1, 2, 1, 2, 1),
        (1, 1, 1, 2, 1, 1),
        (1, 1, 1, 2, 2, 1),
    }
    got = [(d.dp_replicate, d.dp_shard, d.cp, d.tp, d.ep, d.etp) for d in valid_choices(2)]
    assert len(got) == len(expected)
    assert set(got) == expected


def test_valid_choices_fixed():
    choices = valid_choices(8, fixed={"tp": 2, "ep": 2})
    assert choices and all(d.tp == 2 and d.ep == 2 for d in choices)
    assert ParallelDims(**LAYOUT_A) in choices and ParallelDims(**LAYOUT_B3) in choices
    assert ParallelDims(**LAYOUT_B2) not in choices
    assert valid_choices(8, fixed={"tp": 3}) == []


@pytest.mark.parametrize("rank", [0, 6])
def test_device_mesh_with_pp(rank):
    """pp=2 x dp_shard=2 x tp=2: the real DeviceMeshes give the pp groups (r, r+4) and, inside rank's stage,
    the same (fsdp, tp) submeshes as a 4-rank run shifted by 4 * stage; a stage's fully_shard mesh
    views["dp_replicate", "fsdp"] stays inside its stage."""
    dims = ParallelDims(world_size=8, pp=2, dp_shard=2, tp=2)
    with fake_process_group(8, rank) as dist:
        views = build_mesh(dims, "cpu")
        assert views.dense.mesh_dim_names == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
        assert views.all_group_ranks("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
        assert dist.get_process_group_ranks(views["pp"].get_group()) == [rank % 4, rank % 4 + 4]
        stage = rank // 4
        fsdp = views["dp_replicate", "fsdp"]
        assert fsdp.mesh_dim_names == ("dp_replicate", "fsdp")
        assert sorted(fsdp.mesh.flatten().tolist()) == [4 * stage + rank % 2, 4 * stage + rank % 2 + 2]
