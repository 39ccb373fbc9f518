"""ParallelDims.check_model: the shape rules a model must meet on a mesh (seq_len against tp*2*cp and
sequence parallelism, num_experts against ep, heads and hidden sizes against tp, expert hidden sizes against
etp, global_batch against dp, and the pipeline's layers and microbatches against pp). Each expected message
fragment and each hinted fix is written literally from the rule's arithmetic, and every hinted fix is checked
to pass.
"""

from __future__ import annotations

import pytest

from hyper_parallel.mesh import ParallelDims

# --------------------------------------------------------------------------------------------
# shape rules of the dense, expert and data-parallel dims
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
# pipeline rules: layers per stage and microbatches
# --------------------------------------------------------------------------------------------


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
