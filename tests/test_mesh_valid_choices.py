"""``valid_choices``: every valid degree combination of a world size, once each and nothing else, checked
against a brute force over the ParallelDims constructor (8 ranks), a list enumerated by hand (2 ranks), and
the hand-built layouts of tests/mesh_expectations.py (with fixed degrees).
"""

from __future__ import annotations

import itertools

from mesh_expectations import DEGREES, LAYOUT_A, LAYOUT_B, LAYOUT_B2, LAYOUT_B3, is_valid

from hyper_parallel.mesh import ParallelDims, valid_choices


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
            if is_valid(**kw):
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
