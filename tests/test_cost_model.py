"""The analytic cost model (hyper_parallel.cost_model) against independent numbers.

* Bytes of every collective of one step against the traces of the real recipe runs (the session's
  ``recipe_results``, shared with tests/test_recipes.py: no launch of its own), per rank and exactly.
  Rows an EP rank receives depend on the routing, so for EP's all-to-all and ETP's all-reduce the sum
  over all ranks is compared: every routed row is received exactly once, so it is exact too.
* Units, per-rank parameter bytes (padding included) against what the runs allocated (metrics.json
  "units", written by fully_shard's describe_units).
* Counts per (op, group, phase) against the hand-derived counts of tests/test_recipes.py.
* Shapes against the real models' parameters, padding and the llama-8b preset against hand arithmetic.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from conftest import EXTRA_RUNS, matrix, result_of
from test_recipes import expected_collectives

from hyper_parallel import ParallelDims
from hyper_parallel.cost_model import Param, build_units, estimate, get_model, recipe_model
from hyper_parallel.cost_model.layouts import group_ranks
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.recipes import RECIPES
from hyper_parallel.recipes.options import OPTION_NAMES
from hyper_parallel.viz.volume import theoretical_bytes

DATA_DEPENDENT = {("all_to_all", "ep"), ("all_reduce", "etp")}
"""Their bytes on one rank are the rows it receives: set by the routing, exact only summed over ranks."""


def _label(recipe: str, degrees: dict) -> str:
    return f"{recipe}-w{degrees['world_size']}-" + "-".join(
        f"{k}{v}" for k, v in degrees.items() if k != "world_size" and v != 1
    )


def _is_pipeline(recipe: str) -> bool:
    """Pipeline recipes (P1, P2, ...): the cost model has their P2P bytes and bubble (cost_model.pipeline,
    tested below), not yet their per-stage fully_shard units and schedule-dependent gather counts."""
    return RECIPES[recipe].workload.schedule is not None


def _not_costed(recipe: str) -> bool:
    """Async TP's chunks and float8's bytes are not in the cost model yet (the planner's issue #41): its
    counts and bytes for M3-A, M6-A, M3-F8 and M4-F8 are M3's / M6's / M4's. Their traces are held to
    hand-derived counts (tests/test_recipes.py) and bytes (tests/test_tp_sp_traces.py, test_fsdp_float8.py)
    meanwhile."""
    workload = RECIPES[recipe].workload
    return workload.async_tp or workload.float8


def _runs():
    """Every run of the session: the matrix (M4, M6, M7, S1, S2 and the rest) and EXTRA_RUNS (but the runs
    without overlap: the same collectives as their overlapping twins, which tests/test_overlap.py checks)."""
    for recipe, _, degrees in [*matrix(), *((name, -1, degrees) for name, degrees in EXTRA_RUNS)]:
        if "overlap" in degrees or _is_pipeline(recipe) or _not_costed(recipe):
            continue
        yield pytest.param(recipe, degrees, marks=pytest.mark.distributed, id=_label(recipe, degrees))


def _mesh(degrees: dict) -> dict:
    """The degrees of a run's spec without its options (OPTION_RUNS give some)."""
    return {k: v for k, v in degrees.items() if k not in OPTION_NAMES}


def _traced(result, step: int = 1) -> dict[int, dict[tuple, list[int]]]:
    """rank -> (op, group, phase) -> [calls, bytes] of one step."""
    per_rank: dict[int, dict[tuple, list[int]]] = {}
    for rank, events in result.traces.items():
        totals: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        for event in events:
            if event["kind"] == "collective" and event["step"] == step:
                entry = totals[(event["op"], event["group"], event["phase"])]
                entry[0] += 1
                entry[1] += event["bytes"]
        per_rank[rank] = dict(totals)
    return per_rank


# ------------------------------------------------------------------ against the real runs


@pytest.mark.parametrize("recipe, degrees", list(_runs()))
def test_bytes_of_every_collective_equal_the_traces(recipe, degrees, recipe_results):
    result = result_of(recipe, degrees, recipe_results)
    assert result.ok, result.error
    cost = estimate(recipe_model(recipe, result.metrics["options"]), ParallelDims(**_mesh(degrees)))
    model = {(c.op, c.group, c.phase): c for c in cost.collectives}
    traced = _traced(result)
    world = degrees["world_size"]
    keys = set(model) | {key for per in traced.values() for key in per}
    for key in sorted(keys):
        c = model.get(key)
        calls = [traced[rank].get(key, [0, 0])[0] for rank in range(world)]
        sent = [traced[rank].get(key, [0, 0])[1] for rank in range(world)]
        assert c is not None, f"{key} traced {sent} but not in the model"
        assert calls == [c.count] * world, (key, calls, c.count)
        if key[:2] in DATA_DEPENDENT:
            assert sum(sent) == c.bytes * world, (key, sent, c.bytes)
        else:
            assert sent == [c.bytes] * world, (key, sent, c.bytes)


@pytest.mark.parametrize("recipe, degrees", list(_runs()))
def test_units_and_per_rank_parameter_bytes_equal_the_runs(recipe, degrees, recipe_results):
    result = result_of(recipe, degrees, recipe_results)
    dims = ParallelDims(**_mesh(degrees))
    cost = estimate(recipe_model(recipe, result.metrics["options"]), dims)
    element = cost.config.precision.storage
    measured = {unit["unit"]: unit for unit in result.metrics["units"]}
    assert [u.name for u in cost.units] == [unit["unit"] for unit in result.metrics["units"]]
    for unit in cost.units:
        real = measured[unit.name]
        assert (unit.local_numel * element, unit.gathered_numel * element, unit.global_numel * element) == (
            real["model_local_bytes"],
            real["padded_bytes"],
            real["global_bytes"],
        ), unit.name
        assert (unit.shard_size, unit.dp_size, unit.reshard_after_forward) == (
            real["shard_size"],
            real["dp_size"],
            real["reshard_after_forward"],
        ), unit.name
        assert (unit.sharded_group, unit.unsharded_group) == (
            real["sharded_group"]["name"],
            real["unsharded_group"]["name"],
        ), unit.name
        for kind in ("sharded_group", "unsharded_group"):  # rank 0's groups, from the mesh arithmetic
            if real[kind]["name"]:
                mine = next(g for g in group_ranks(dims, real[kind]["name"]) if 0 in g)
                assert sorted(real[kind]["ranks"]) == mine, (unit.name, kind)
    stored = sum(real["padded_bytes"] // real["shard_size"] for real in measured.values())
    assert cost.memory.parameters == stored == cost.memory.gradients


@pytest.mark.distributed
def test_the_extra_run_exercises_fsdp_padding(recipe_results):
    recipe, degrees = EXTRA_RUNS[0]
    units = result_of(recipe, degrees, recipe_results).metrics["units"]
    padded = [u["unit"] for u in units if u["padded_bytes"] > u["model_local_bytes"]]
    assert padded == ["layers.1"]  # its router.gate.weight [4, 32] over fsdp=8: 4 rows of padding
    unit = next(u for u in estimate(recipe_model(recipe), ParallelDims(**degrees)).units if u.name == "layers.1")
    assert unit.gathered_numel - unit.local_numel == 4 * 32


@pytest.mark.distributed
def test_theoretical_bytes_is_the_cost_models_fsdp_part(recipe_results):
    """viz.volume.theoretical_bytes delegates to the cost model: without padding they agree on FSDP groups."""
    degrees = RECIPES["M7"].default
    units = result_of("M7", degrees, recipe_results).metrics["units"]
    cost = estimate(recipe_model("M7"), ParallelDims(**degrees))
    assert theoretical_bytes(units) == {k: v for k, v in cost.by_op_group().items() if k[1] in ("fsdp", "dp_replicate")}


SCHEME_RUNS = {"A-CP": "all_gather", "M5-R": "ring", "M5-U": "ulysses"}
"""The three sequence schemes on one mesh (world 4, cp 4) in the session's runs."""
CP4 = {"world_size": 4, "cp": 4}


@pytest.mark.distributed
def test_sequence_schemes_figure_shows_traced_bytes_equal_to_the_model(recipe_results):
    """viz.volume.sequence_schemes on the three cp=4 runs: each bar is the trace's cp bytes per layer
    (rank 0) and each black tick the cost model's, and both are the hand-derived numbers of
    test_sequence_scheme_bytes_per_layer_by_hand (K = 4 KiB at cp 4)."""
    from hyper_parallel.viz.volume import sequence_schemes, sequence_traffic

    runs = {
        r: (result_of(r, CP4, recipe_results).traces, result_of(r, CP4, recipe_results).metrics) for r in SCHEME_RUNS
    }
    by_hand = {"A-CP": (32768, 32768), "M5-R": (24576, 40960), "M5-U": (16384, 16384)}  # per layer (forward, backward)
    for recipe, (traces, _) in runs.items():
        forward, backward = by_hand[recipe]
        assert sequence_traffic(traces, 1) == {"forward": 2 * forward, "backward": 2 * backward}
    fig = sequence_schemes(runs, step=1)
    ax = next(a for a in fig.axes if a.get_label() == "per_layer")
    bars = [p.get_height() for p in ax.patches if p.get_gid() == "measured"]
    ticks = [line.get_ydata()[0] for line in ax.get_lines() if line.get_gid() == "model"]
    expected = [b for r in SCHEME_RUNS for b in by_hand[r]]
    assert bars == expected and ticks == expected
    sent = [p.get_height() for p in ax.patches if p.get_gid() == "sent"]
    assert sent == [49152, 65536, 24576]


@pytest.mark.distributed
def test_two_d_sequence_bytes_of_the_cost_model_equal_the_traces(recipe_results):
    """M5-UR (cp 2 x ulysses 2): rank 0's traced bytes per (op, group, phase) on ulysses and cp equal the cost
    model's, row by row (notebook 04's table, launch.notebook.tables.traced_and_model_bytes): the all-to-alls
    on ulysses in forward and backward, the ring's send/recv on cp."""
    from launch.notebook.tables import traced_and_model_bytes

    result = result_of("M5-UR", RECIPES["M5-UR"].default, recipe_results)
    assert result.ok, result.error
    rows = traced_and_model_bytes(result, groups=("ulysses", "cp"))
    assert {(op, group) for op, group, *_ in rows} == {("all_to_all", "ulysses"), ("send", "cp"), ("recv", "cp")}
    assert [traced for *_, traced, _ in rows] == [model for *_, model in rows]
    assert all(model > 0 for *_, model in rows)


# ------------------------------------------------------------------ no workers


def test_sequence_scheme_bytes_per_layer_by_hand():
    """The small model (8 rows, seq 16, 4 heads of 8, float32) on cp ranks, per layer on one rank, with
    K = 8 rows * (16 / cp) tokens * 4 heads * 8 * 4 bytes (one of this rank's q, k, v): 8 KiB at cp 2,
    4 KiB at cp 4.
    all_gather: forward AG of K and V of the whole sequence, 2 K cp; backward RS the same; sent
                (cp-1)/cp of each: 4 K (cp-1).
    ring:       forward cp-1 K/V blocks of 2 K sent whole; backward cp-2 K/V blocks and cp-1 dK/dV blocks
                (float32: 2 K too): 2 K (cp-1) forward, 2 K (2 cp - 3) backward, all of it sent.
    ulysses:    q/k/v (3 K) and the output (K) all-to-all'd in each phase: 4 K per phase, 8 K (cp-1)/cp sent.
    """
    from hyper_parallel.cost_model.communication import sequence_bytes_per_layer

    small = get_model("small")
    expected = {  # (scheme, cp): (forward, backward, sent)
        ("all_gather", 2): (32768, 32768, 32768),
        ("all_gather", 4): (32768, 32768, 49152),
        ("ring", 2): (16384, 16384, 32768),
        ("ring", 4): (24576, 40960, 65536),
        ("ulysses", 2): (32768, 32768, 32768),
        ("ulysses", 4): (16384, 16384, 24576),
    }
    for (scheme, cp), (forward, backward, sent) in expected.items():
        got = sequence_bytes_per_layer(small.replace(sequence_scheme=scheme), ParallelDims(world_size=cp, cp=cp), 8)
        assert got == {"forward": forward, "backward": backward, "sent": sent}, (scheme, cp)
    # with TP the heads of a rank halve, and so does every byte (M6-U: cp 2, tp 2)
    got = sequence_bytes_per_layer(small.replace(sequence_scheme="ulysses"), ParallelDims(world_size=4, cp=2, tp=2), 8)
    assert got == {"forward": 16384, "backward": 16384, "sent": 16384}


def test_ulysses_head_rule_in_the_cost_model():
    ulysses = get_model("small").replace(sequence_scheme="ulysses")
    with pytest.raises(ValueError, match=r"num_heads=4 must be divisible by tp\*cp = 2\*4 = 8 with Ulysses"):
        estimate(ulysses, ParallelDims(world_size=8, cp=4, tp=2))
    estimate(ulysses.replace(sequence_scheme="all_gather"), ParallelDims(world_size=8, cp=4, tp=2))  # K/V: no head rule
    with pytest.raises(ValueError, match="sequence_scheme must be"):
        get_model("small").replace(sequence_scheme="zigzag")


@pytest.mark.distributed
@pytest.mark.parametrize(
    "recipe, degrees", [pytest.param(r, d, id=_label(r, d)) for r, _, d in matrix() if _is_pipeline(r)]
)
def test_p2p_bytes_of_the_cost_model_equal_the_traces(recipe, degrees, recipe_results):
    """Every rank's send/recv bytes of one step, by phase, equal cost_model.pipeline.p2p_bytes.

    By hand for P1 on (pp=2, dp_shard=2): each data-parallel rank has 8/2 = 4 rows, 4 microbatches of 1
    row; the hidden states crossing the boundary are 1 x 16 x 32 fp32 = 2048 B. Stage 0 sends 4 x 2048 =
    8192 B forward and receives as much backward; stage 1 the mirror image. Interleaved (P1-I): each
    rank's two stages both cross a boundary each way but stage 0 / stage 3 on one side only, so rank 0
    sends 16384 B forward and 8192 B backward. TP (P2) changes nothing: every tp rank sends its replica.
    The V placement (P4, P5 on pp 2: 8 rows per dp rank, 4 microbatches of 2 rows, 4096 B): rank 0 holds the
    first and the last stage, each with its neighbour on rank 1, so it sends and receives 4 x 4096 B each
    way; stages pp-1 and pp share a rank and pass their tensor in memory.
    """
    from hyper_parallel.cost_model.pipeline import boundary_bytes, p2p_bytes

    result = result_of(recipe, degrees, recipe_results)
    assert result.ok, result.error
    dims = ParallelDims(**degrees)
    notes = result.metrics["notes"]
    rows = result.metrics["options"]["global_batch"] // dims.dp // notes["microbatches"]
    message = boundary_bytes(rows=rows, seq_len=16, d_model=32)
    assert message == notes["boundary_bytes"]
    for rank, events in result.traces.items():
        traced = {
            key: 0 for key in (("send", "forward"), ("recv", "forward"), ("send", "backward"), ("recv", "backward"))
        }
        for event in events:
            if event["kind"] == "collective" and event["group"] == "pp" and event["step"] == 1:
                traced[(event["op"], event["phase"])] += event["bytes"]
        pp_rank = dims.coordinates(rank)[MeshDim.PP]
        expected = p2p_bytes(
            dims.pp, pp_rank, notes["microbatches"], message, notes["stages_per_rank"], notes["schedule"]
        )
        assert traced == expected, (rank, traced, expected)


@pytest.mark.parametrize(
    "recipe, degrees",
    [pytest.param(r, d, id=_label(r, d)) for r, _, d in matrix() if not (_is_pipeline(r) or _not_costed(r))],
)
def test_counts_equal_the_hand_derived_counts(recipe, degrees):
    counts = estimate(recipe_model(recipe), ParallelDims(**degrees)).counts()
    assert counts == dict(+expected_collectives(recipe, degrees))  # unary + drops zero counts


def test_presets_describe_the_recipes_models():
    from hyper_parallel.models.mlp import MLP, MLPConfig
    from hyper_parallel.models.transformer import Transformer, TransformerConfig
    from hyper_parallel.recipes import moe

    small, small_moe, mlp = get_model("small"), get_model("small-moe"), get_model("small-mlp")
    real = TransformerConfig()
    assert (small.vocab_size, small.d_model, small.n_heads, small.n_layers, small.ffn_hidden, small.seq_len) == (
        real.vocab_size,
        real.d_model,
        real.n_heads,
        real.n_layers,
        real.hidden,
        real.seq_len,
    )
    assert small.global_batch == RECIPES["M2"].shapes["global_batch"]
    assert mlp.global_batch == RECIPES["M1"].shapes["global_batch"]
    m = moe.MOE_CONFIG
    assert (small_moe.moe_layers, small_moe.num_experts, small_moe.top_k, small_moe.moe_hidden) == (
        m.moe_layers,
        m.num_experts,
        m.top_k,
        m.moe_hidden,
    ) and m.shared_expert
    single = ParallelDims(world_size=1)
    for config, model in ((small, Transformer(real)), (small_moe, Transformer(m)), (mlp, MLP(MLPConfig()))):
        units = {u.name: u for u in build_units(config, single)}
        names = {f"{u.name}.{p.name}".removeprefix("root.") for u in units.values() for p in u.params}
        shapes = {f"{u.name}.{p.name}".removeprefix("root."): p.global_shape for u in units.values() for p in u.params}
        real_params = dict(model.named_parameters())
        assert names == set(real_params), config.name
        assert shapes == {name: tuple(p.shape) for name, p in real_params.items()}, config.name


def test_padding_and_fsdp_axis_by_hand():
    # plain [10, 6] over 4 shards: axis 0, ceil(10/4) = 3 rows each, 12 rows in the buffer
    assert Param("w", (10, 6), (10, 6)).padded_numel(4) == 12 * 6
    # colwise [32, 16] with tp=2 -> local [16, 16], axis 0 split by tp: FSDP takes axis 1, ceil(16/3) = 6
    assert Param("w", (32, 16), (16, 16), split_axes=(0,)).padded_numel(3) == 16 * 18
    # a norm [30] over 8 shards: 4 each, 32 in the buffer
    assert Param("n", (30,), (30,)).padded_numel(8) == 32
    units = build_units(get_model("small-mlp").replace(d_model=30, ffn_hidden=60), ParallelDims(world_size=4))
    block = units[0]  # norm 30, w1 [60, 30] + 60, w2 [30, 60] + 30, all on axis 0 over 4 shards
    assert block.gathered_numel == 32 + 60 * 30 + 60 + 32 * 60 + 32
    assert block.shard_numel * 4 == block.gathered_numel


def test_llama_8b_parameters_and_memory_by_hand():
    config = get_model("llama-8b-like")
    d, kv, f, v, layers = 4096, 8 * 128, 14336, 128256, 32
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    dims = ParallelDims(world_size=4096, dp_replicate=8, dp_shard=16, cp=2, tp=16)
    cost = estimate(config, dims)
    assert cost.parameter_count == layers * per_layer + 2 * v * d + d == 8_030_261_248
    # every rank stores its tp shard of each matrix, FSDP-sharded over fsdp = dp_shard * cp = 32;
    # K/V: 8 heads over tp=16 -> one replicated head per rank; norms [4096] are not split by tp
    # (no padding: every FSDP axis, d, d/16, f/16 or vocab-free, divides by 32)
    local = layers * ((2 * d * d + 3 * d * f) // 16 + 2 * 128 * d + 2 * d) + 2 * (v // 16) * d + d
    assert sum(u.gathered_numel for u in cost.units) == local
    assert cost.memory.parameters == local // 32 * 4
    assert cost.memory.optimizer == 2 * cost.memory.parameters  # Adam m and v in float32


def test_invalid_layouts_raise_the_rules_message():
    with pytest.raises(ValueError, match=r"num_heads=32 must be divisible by tp=64"):
        estimate(get_model("llama-8b-like"), ParallelDims(world_size=64, tp=64))
    with pytest.raises(ValueError, match=r"global_batch=512 must be divisible by dp"):
        estimate(get_model("llama-8b-like"), ParallelDims(world_size=1024, dp_shard=1024))
    with pytest.raises(ValueError, match=r"num_experts=16 must be divisible by ep=32"):
        estimate(get_model("moe-16e"), ParallelDims(world_size=64, dp_shard=64, ep=32))
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5'"):
        get_model("gpt-5")


def test_cost_model_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from hyper_parallel.cost_model import estimate, get_model; "
        "from hyper_parallel.cost_model.ranking import rank_layouts; from hyper_parallel import ParallelDims; "
        "estimate(get_model('moe-16e'), ParallelDims(world_size=64, dp_shard=64, ep=8)); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
