"""Valid ParallelDims combinations and the degrees derived from them (docs/design.md §2): the inferred
dp_shard, fsdp, dp, dp_cp and efsdp of each combination are written by hand from the formulas below, every
view's sizes must multiply to world_size, and ``replace`` validates its result again.
"""

from __future__ import annotations

import pytest
from mesh_expectations import DEGREES

from hyper_parallel.mesh import ParallelDims

# --------------------------------------------------------------------------------------------
# valid combinations and their derived degrees (computed by hand from the rules of docs/design.md §2)
#    fsdp = dp_shard*cp*ulysses, dp = dp_replicate*dp_shard, dp_cp = dp_replicate*dp_shard*cp*ulysses,
#    efsdp = dp_shard*cp*tp // (ep*etp); dp_shard=-1 -> world_size // (dp_replicate*cp*ulysses*tp*pp)
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
    # a ulysses dim shards parameters and averages the loss like cp: fsdp = dp_shard*cp*ulysses, dp_cp =
    # dp*cp*ulysses (efsdp keeps its formula: experts never run with a ulysses dim)
    pytest.param(dict(world_size=4, cp=2, ulysses=2), (1, 4, 1, 4, 2), id="cp2-ulysses2"),
    pytest.param(dict(world_size=16, dp_replicate=2, cp=2, ulysses=2), (2, 8, 4, 16, 4), id="hsdp-cp2-ulysses2"),
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


def test_degrees_read_as_one_label_outermost_first():
    """Every table, message and widget writes degrees this one way: those other than 1, pp (the outermost
    dim) first, ep and etp last; the world size first on request; "-" when every degree is 1."""
    dims = ParallelDims(world_size=16, tp=2, pp=2, dp_shard=2, ep=2, etp=2, dp_replicate=2)
    assert dims.label() == "pp=2, dp_replicate=2, dp_shard=2, tp=2, ep=2, etp=2"
    assert (
        dims.label(world=True, sep=" x ") == "world_size=16: pp=2 x dp_replicate=2 x dp_shard=2 x tp=2 x ep=2 x etp=2"
    )
    assert ParallelDims(world_size=1).label() == "-" and ParallelDims(world_size=1).label(world=True) == "world_size=1"
