"""ParallelDims rejects every invalid degree combination (docs/design.md §2) with a ValueError naming the
rule, the numbers and, where it gives one, a fix: the world-size equation, an uninferable dp_shard, the
ep/etp rules, bad types and non-positive degrees. Each expected message fragment is written literally; every
hint the message gives is checked by constructing it, and a hinted list of valid ep is checked complete by
brute force over the constructor.
"""

from __future__ import annotations

import ast
import re

import pytest
from mesh_expectations import is_valid

from hyper_parallel.mesh import ParallelDims

# --------------------------------------------------------------------------------------------
# invalid degree combinations: ValueError with the rule, the numbers and (where given) a hint
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
        dict(world_size=8, tp=2, etp=2),
        ["etp=2 requires ep > 1", "set etp=1", "keep etp=tp=2 with ep in [2, 4]"],
        id="etp2-ep1",
    ),
    pytest.param(
        dict(world_size=8, tp=4, etp=4), ["etp=4 requires ep > 1", "keep etp=tp=4 with ep in [2]"], id="etp4-ep1"
    ),
    pytest.param(
        dict(world_size=8, etp=2),
        ["etp=2 requires ep > 1", "set etp=1 (etp must be 1 or tp, and tp=1 here)"],
        id="etp2-ep1-tp1",
    ),
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
        brute = [ep for ep in range(2, 2 * kwargs["world_size"] + 1) if is_valid(**{**kwargs, "ep": ep})]
        assert listed == brute
    if "no ep > 1 fits these degrees" in message:
        assert not any(is_valid(**{**kwargs, "ep": ep}) for ep in range(2, 2 * kwargs["world_size"] + 1))
    m = re.search(r"valid \(ep, etp\) with etp=\d+: (\[.*\])", message)
    if m:
        for ep, etp in ast.literal_eval(m.group(1)):
            ParallelDims(**{**kwargs, "ep": ep, "etp": etp})
    if "requires ep > 1" in message and "set etp=1" in message:
        ParallelDims(**{**kwargs, "etp": 1})
    m = re.search(r"keep etp=tp=(\d+) with ep in \[([\d, ]+)\]", message)
    if m:  # every ep listed fits with etp = tp, and no other ep > 1 does
        listed = [int(x) for x in m.group(2).split(",")]
        keep = {**kwargs, "etp": int(m.group(1))}
        brute = [ep for ep in range(2, 2 * kwargs["world_size"] + 1) if is_valid(**{**keep, "ep": ep})]
        assert listed == brute


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


def test_etp_requires_ep_is_checked_before_etp_in_1_tp():
    # etp=2 with tp=1 violates both rules; the ep rule is the one reported
    with pytest.raises(ValueError, match=r"etp=2 requires ep > 1"):
        ParallelDims(world_size=8, etp=2)
