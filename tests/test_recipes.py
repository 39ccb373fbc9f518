"""Every recipe of the matrix through `launch.run` on its default mesh and its alternative meshes.

Checks per run: losses each step and parameters after the last step equal the single-process
reference (fp32, rtol 1e-5); the same recipe gives the same losses on every mesh (the global
batch is fixed per recipe); and the collectives of one step, read from rank 0's trace, equal the
counts derived by hand below.
"""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import matrix, result_of, run_key  # the session's runs (recipe_results) are shared with test_cost_model

import launch
from hyper_parallel import ParallelDims
from hyper_parallel.recipes import RECIPES

LAYERS = 2  # TransformerConfig.n_layers and MLPConfig.n_blocks
UNITS = LAYERS + 1  # one fully_shard unit per block + the root


def runs():
    for recipe, index, degrees in matrix():
        tier = RECIPES[recipe].tier
        marks = [pytest.mark.distributed] + ([getattr(pytest.mark, tier)] if tier else [])
        label = "-".join(f"{k}{v}" for k, v in degrees.items() if k != "world_size" and v != 1)
        yield pytest.param(recipe, index, degrees, marks=marks, id=f"{recipe}-w{degrees['world_size']}-{label}")


def step_collectives(result: launch.RunResult, step: int = 1) -> Counter:
    return Counter(
        (e["op"], e["group"], e["phase"]) for e in result.traces[0] if e["kind"] == "collective" and e["step"] == step
    )


def expected_collectives(recipe: str, d: dict) -> Counter:
    """Hand-derived collectives of one training step on rank 0, by the recipe's workload.

    fully_shard with sharding: every unit all-gathers in forward, the non-root units again in backward
    (the root keeps its parameters), and each unit reduce-scatters once; HSDP adds one all-reduce per
    unit over dp_replicate. Without sharding (M1-M3, or a workload that shards wherever it can on a mesh
    whose fsdp dim is 1): one all-reduce per unit over the whole data-parallel group, or nothing when it
    has one rank.
    TP without SP: forward all-reduces after the embedding and after wo and w2 of each layer (2L+1) and
    all-gathers the vocab-sharded logits once; backward all-reduces the input gradient of each block
    input (attention, feed-forward: 2 per layer, the colwise layers' partial gradients summed by
    PrepareModuleInput first) and of the head (1).
    TP with SP: forward all-gathers each dense block's two inputs (attention, feed-forward), the head
    input and the logits (2L+2), and reduce-scatters after wo, w2 and the embedding (2L+1); backward
    mirrors it (2L+1 each); the norm weights' Partial gradients add one tp all-reduce per dense unit.
    A MoE block under SP skips the feed-forward all-gather / reduce-scatter (etp=1: it works on its
    sequence shard) or all-gathers its input (etp=tp: the output is cut back to the shard without
    communication; in backward that cut becomes an all-gather and the input gather a local cut).
    CP: one K/V all-gather per attention in forward, one reduce-scatter in backward (M5, M6); ring
    (M5-R): per attention cp-1 K/V blocks sent to the next rank and received from the previous one in
    forward, cp-2 K/V blocks and cp-1 dK/dV blocks each way in backward (the ring retraced);
    Ulysses (M5-U, M6-U): per attention one all-to-all of the stacked q/k/v and one of the output in
    forward, the same two in backward (no GQA here). A ulysses dim (M5-UR) adds those two all-to-alls
    each way on the ulysses group to the ring's sends and receives on cp.
    Async TP (M3-A, M6-A): each dense block's gather and scatter, forward and backward, becomes tp chunks
    (one collective each); the embedding's, the head's and the logits' stay whole. Float8 TP (M3-F8): M3's
    collectives, the block inputs (forward) and rowwise output gradients (backward) gathered in float8; the
    amax reductions of the casts run inside DTensor operators, where the tracer does not see them. Float8
    all-gather under FSDP (M4-F8): M4's collectives, and before each all-gather of a block unit every float8
    weight's fsdp_pre_all_gather all-reduces its amax over fsdp (2 weights per block, forward and backward).
    EP per MoE layer (all-to-all dispatch): forward counts + dispatch + combine all-to-alls, backward
    two; all-gather dispatch: forward counts and rows all-gathered, outputs reduce-scattered, backward
    one of each. ETP: one etp all-reduce per MoE layer in each direction. The experts are a unit of
    their own on efsdp (one AG forward, one AG backward, one RS when efsdp > 1).
    """
    dims = ParallelDims(**d)  # only to infer dp_shard
    tp, cp, dp_replicate, fsdp = dims.tp, dims.cp, dims.dp_replicate, dims.fsdp
    workload = RECIPES[recipe].workload  # what the recipe's implementation builds, as data
    if workload.schedule in V_SCHEDULES:
        return expected_v_pipeline_collectives(dims, RECIPES[recipe].options(dims).microbatches)
    if workload.schedule is not None:
        return expected_pipeline_collectives(workload.schedule, workload.moe, dims)
    moe = workload.moe
    moe_layers = 1 if moe else 0  # MOE_CONFIG.moe_layers == (1,)
    dense_layers = LAYERS - moe_layers
    expected: Counter = Counter()
    shards = fsdp > 1 if workload.param_shard is None else workload.param_shard  # None: wherever a shard dim > 1
    if not shards:
        if dp_replicate * fsdp > 1:
            expected[("all_reduce", "dp_replicate+fsdp", "backward")] = UNITS
    else:
        expected[("all_gather", "fsdp", "forward")] = UNITS
        expected[("all_gather", "fsdp", "backward")] = UNITS - 1
        expected[("reduce_scatter", "fsdp", "backward")] = UNITS
        if dp_replicate > 1:
            expected[("all_reduce", "dp_replicate", "backward")] = UNITS
        if workload.float8 and fsdp > 1:  # M4-F8: the MLP's w1 and w2 per block
            expected[("all_reduce", "fsdp", "forward")] = 2 * LAYERS
            expected[("all_reduce", "fsdp", "backward")] = 2 * LAYERS
    sequence_parallel = workload.sequence_parallel is not False  # None: wherever tp > 1
    moe_input_gathers = moe_layers if dims.etp > 1 else 0
    chunks = tp if workload.async_tp else 1  # async TP: each block's gather / scatter in tp chunks
    if tp > 1 and sequence_parallel:
        expected[("all_gather", "tp", "forward")] = chunks * 2 * dense_layers + moe_layers + moe_input_gathers + 2
        expected[("reduce_scatter", "tp", "forward")] = chunks * 2 * dense_layers + moe_layers + 1
        expected[("all_gather", "tp", "backward")] = chunks * 2 * dense_layers + moe_layers + moe_input_gathers + 1
        expected[("reduce_scatter", "tp", "backward")] = chunks * 2 * dense_layers + moe_layers + 1
        expected[("all_reduce", "tp", "backward")] = UNITS
    elif tp > 1:
        expected[("all_reduce", "tp", "forward")] = 2 * LAYERS + 1
        expected[("all_gather", "tp", "forward")] = 1
        expected[("all_reduce", "tp", "backward")] = 2 * LAYERS + 1
    if dims.ulysses > 1:  # M5-UR: Ulysses' all-to-alls around the ring, on their own dim
        expected[("all_to_all", "ulysses", "forward")] = 2 * LAYERS
        expected[("all_to_all", "ulysses", "backward")] = 2 * LAYERS
    if cp > 1 and workload.sequence_scheme == "ring":
        for op in ("send", "recv"):
            expected[(op, "cp", "forward")] = (cp - 1) * LAYERS
            expected[(op, "cp", "backward")] = (2 * cp - 3) * LAYERS
    elif cp > 1 and workload.sequence_scheme == "ulysses":
        expected[("all_to_all", "cp", "forward")] = 2 * LAYERS
        expected[("all_to_all", "cp", "backward")] = 2 * LAYERS
    elif cp > 1:
        expected[("all_gather", "cp", "forward")] = LAYERS
        expected[("reduce_scatter", "cp", "backward")] = LAYERS
    if moe:
        if workload.dispatch == "all_gather":
            expected[("all_gather", "ep", "forward")] = 2 * moe_layers
            expected[("reduce_scatter", "ep", "forward")] = moe_layers
            expected[("all_gather", "ep", "backward")] = moe_layers
            expected[("reduce_scatter", "ep", "backward")] = moe_layers
        else:
            expected[("all_to_all", "ep", "forward")] = 3 * moe_layers
            expected[("all_to_all", "ep", "backward")] = 2 * moe_layers
        if dims.etp > 1:
            expected[("all_reduce", "etp", "forward")] = moe_layers
            expected[("all_reduce", "etp", "backward")] = moe_layers
        if dims.efsdp > 1:
            expected[("all_gather", "efsdp", "forward")] = moe_layers
            expected[("all_gather", "efsdp", "backward")] = moe_layers
            expected[("reduce_scatter", "efsdp", "backward")] = moe_layers
        if dp_replicate > 1:
            expected[("all_reduce", "dp_replicate", "backward")] += moe_layers
    return expected


MICROBATCHES = 4  # hyper_parallel.recipes.pipeline.MICROBATCHES
PP_LAYERS = 4  # PIPELINE_CONFIG.n_layers


def expected_pipeline_collectives(
    schedule: str, moe: bool, dims: ParallelDims, reshard_after_forward: bool = False
) -> Counter:
    """Hand-derived collectives of one step on rank 0 of a pipeline recipe (pp=2, m=4 microbatches).

    Rank 0 holds stage 0 (the embedding and the first layers; interleaved: stage 0 = embedding + layer 0,
    and stage 2 = layer 2). P2P per microbatch: a stage that is not the last sends its output forward
    and receives its gradient backward; one that is not the first receives its input and sends the
    input's gradient.
    fully_shard (fsdp > 1): every stage module is a fully_shard root (an FSDPModule to torch), so the
    schedule turns gradient sync and resharding after backward off for each microbatch and reduces once
    at the end of the step: each unit reduce-scatters once per step. No unit reshards after forward
    (torchtitan's default under PP), so each unit that holds parameters gathers once per step, in its
    first forward, and never in backward: rank 0 holds stage 0's root (the embedding) and its layers
    (interleaved: stage 2's lone layer too, under a root holding nothing). The interleaved runtime
    unshards every unit before the step's first forward (its UNSHARD actions, outside forward), so its
    gathers are traced outside the forward phase.
    ``reshard_after_forward=True`` (every unit but the root reshards after forward, FSDP2's default): a
    layer unit gathers in a forward that follows a forward (or starts the step) and in a backward that
    follows a forward; a root unit gathers once, in its first forward. Rank 0's orders: GPipe F0 F1 F2 F3
    B0 B1 B2 B3 (a layer: 4 forward, 1 backward gathers); 1F1B F0 F1 B0 F2 B1 F3 B2 B3 (2 and 3);
    interleaved (microbatches in rounds of pp=2): stage 0 runs F0-F3 before B0 (4 and 1), stage 2 F0 F1 B0
    B1 F2 F3 B2 B3 (3 and 2), the runtime's UNSHARD gathering each unit's first.
    P3 adds S1's all-to-alls of the MoE layer per microbatch (efsdp = 1 on its mesh: no expert gathers).
    TP without SP on stage 0 per microbatch: forward all-reduces after the embedding and wo, w2 of each
    layer (1 + 2 L_s), backward the input gradients of attention and feed-forward (2 L_s).
    """
    m, stages_per_rank = MICROBATCHES, 2 if schedule == "interleaved_1f1b" else 1
    layers_per_stage = PP_LAYERS // (dims.pp * stages_per_rank)
    expected: Counter = Counter()
    stages = [0, 2] if schedule == "interleaved_1f1b" else [0]
    last = dims.pp * stages_per_rank - 1
    for stage in stages:
        if stage != last:
            expected[("send", "pp", "forward")] += m
            expected[("recv", "pp", "backward")] += m
        if stage != 0:
            expected[("recv", "pp", "forward")] += m
            expected[("send", "pp", "backward")] += m
    if dims.fsdp > 1:
        orders = {
            "gpipe": ["F0 F1 F2 F3 B0 B1 B2 B3"],
            "1f1b": ["F0 F1 B0 F2 B1 F3 B2 B3"],
            "interleaved_1f1b": ["F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 B0 B1 F2 F3 B2 B3"],
        }[schedule]
        units = 1 + layers_per_stage * len(orders)  # stage 0's root and the layers of rank 0's stages
        for order in orders:  # the stages rank 0 holds; stage 0 also holds a root with parameters
            actions = order.split()
            after = list(zip(["start", *actions], actions))
            forward_gathers = sum(now[0] == "F" and before[0] != "B" for before, now in after)
            backward_gathers = sum(now[0] == "B" and before[0] == "F" for before, now in after)
            if not reshard_after_forward:
                forward_gathers, backward_gathers = 1, 0
            expected[("all_gather", "fsdp", "forward")] += layers_per_stage * forward_gathers
            expected[("all_gather", "fsdp", "backward")] += layers_per_stage * backward_gathers
        expected[("all_gather", "fsdp", "forward")] += 1  # stage 0's root (the embedding), in its first forward
        expected[("reduce_scatter", "fsdp", "backward")] += units
        if schedule == "interleaved_1f1b":  # its runtime unshards each unit ahead of the first forward (UNSHARD)
            expected[("all_gather", "fsdp", "forward")] -= units
            expected[("all_gather", "fsdp", "other")] += units
    if dims.tp > 1:
        expected[("all_reduce", "tp", "forward")] = m * (1 + 2 * layers_per_stage)
        expected[("all_reduce", "tp", "backward")] = m * 2 * layers_per_stage
    if moe:  # per microbatch as in S1: counts + dispatch + combine forward, two backward; efsdp = 1 here
        expected[("all_to_all", "ep", "forward")] = 3 * m
        expected[("all_to_all", "ep", "backward")] = 2 * m
    return expected


V_SCHEDULES = ("zbv", "dualpipev")
V_LAYERS = 8  # the zero-bubble recipes' n_layers (recipes/pipeline.py ZERO_BUBBLE_CONFIG)


def expected_v_pipeline_collectives(dims: ParallelDims, microbatches: int) -> Counter:
    """Hand-derived collectives of one step on rank 0 of a V-placed pipeline (P4 ZB-V, P5 DualPipeV).

    Rank 0 runs stage 0 (the embedding and 8 / (2 pp) layers) and stage 2 pp - 1 (as many layers, the final
    norm and the head); their neighbours, stages 1 and 2 pp - 2, run on rank 1. Per microbatch stage 0 sends
    its output and receives its gradient, the last stage receives its input and sends its gradient: m of
    each. fully_shard: the runtime unshards every unit with parameters ahead of the step's first forward
    (its UNSHARD actions, outside forward: two roots and the layers of both stages), nothing reshards until
    the step's end, and each unit reduce-scatters once. B and W split the backward's compute, not its
    communication.
    """
    m, layers_per_stage = microbatches, V_LAYERS // (2 * dims.pp)
    expected: Counter = Counter()
    for op, phase in (("send", "forward"), ("recv", "backward"), ("recv", "forward"), ("send", "backward")):
        expected[(op, "pp", phase)] = m
    if dims.fsdp > 1:
        units = 2 + 2 * layers_per_stage
        expected[("all_gather", "fsdp", "other")] = units
        expected[("reduce_scatter", "fsdp", "backward")] = units
    return expected


@pytest.mark.parametrize("recipe, index, degrees", list(runs()))
def test_recipe_matches_reference(recipe, index, degrees, recipe_results):
    result = result_of(recipe, degrees, recipe_results)
    assert result.ok, result.error
    metrics = result.metrics
    assert len(metrics["losses"]) == 2
    for loss, reference in zip(metrics["losses"], metrics["reference_losses"]):
        assert loss == pytest.approx(reference, rel=1e-5, abs=1e-6)
    assert metrics["mismatched_params"] == []
    assert set(result.traces) == set(range(degrees["world_size"]))
    assert step_collectives(result) == expected_collectives(recipe, degrees)


@pytest.mark.distributed
@pytest.mark.parametrize("recipe", [r.name for r in RECIPES.values() if r.alternatives and not r.workload.float8])
def test_same_recipe_same_losses_on_every_mesh(recipe, recipe_results):
    """The mesh changes where numbers are computed, not what: the same losses (fp32 rounding) on every mesh.
    Float8 recipes are left out: their dynamic scales take each data-parallel rank's own amax, so their
    losses depend on dp by design (each mesh is held to its own reference, which scales per dp rank too)."""
    spec = RECIPES[recipe]
    results = [result_of(recipe, degrees, recipe_results) for degrees in (spec.default, *spec.alternatives)]
    assert all(r.ok for r in results), [r.error for r in results]
    first = results[0].metrics
    for other in results[1:]:
        assert other.metrics["reference_losses"] == first["reference_losses"]
        assert other.metrics["losses"] == pytest.approx(first["losses"], rel=1e-5)


SAME_MESH_SCHEMES = [  # (recipes that differ only in the sequence scheme, the mesh they share)
    (("M5", "M5-R", "M5-U"), {"world_size": 2, "cp": 2, "dp_shard": 1}),
    (("A-CP", "M5-R", "M5-U"), {"world_size": 4, "cp": 4}),
    (("M6", "M6-U"), {"world_size": 4, "dp_shard": 1, "cp": 2, "tp": 2}),
    (("M6", "M6-U"), {"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2}),
    (("M3", "M3-A"), {"world_size": 2, "tp": 2}),
    (("M6", "M6-A"), {"world_size": 4, "dp_shard": 1, "cp": 2, "tp": 2}),
]


@pytest.mark.distributed
@pytest.mark.parametrize(
    "recipes, degrees", SAME_MESH_SCHEMES, ids=["-".join(r) + f"-w{d['world_size']}" for r, d in SAME_MESH_SCHEMES]
)
def test_sequence_schemes_give_the_same_losses(recipes, degrees, recipe_results):
    """K/V all-gather, ring and Ulysses attend over the same tokens with the same weights: on one mesh
    their losses agree to float32 rounding (the summation order inside attention differs). So do TP+SP
    with one collective per step and with async TP's chunks (the matmuls' rows in another grouping)."""
    results = [result_of(recipe, degrees, recipe_results) for recipe in recipes]
    assert all(r.ok for r in results), [r.error for r in results]
    assert len({run_key(recipe, degrees)[0] for recipe in recipes}) == len(recipes)  # really different workloads
    first = results[0].metrics["losses"]
    for recipe, other in zip(recipes[1:], results[1:]):
        assert other.metrics["losses"] == pytest.approx(first, rel=1e-5), recipe


@pytest.mark.parametrize(
    "recipe, degrees, message",
    [
        ("M5-U", {"world_size": 8, "cp": 8}, "num_heads=4 must be divisible by tp*cp = 1*8 = 8 with Ulysses"),
        ("M6-U", {"world_size": 8, "cp": 4, "tp": 2}, "num_heads=4 must be divisible by tp*cp = 2*4 = 8 with Ulysses"),
    ],
)
def test_ulysses_head_rule(recipe, degrees, message):
    """4 heads: Ulysses allows tp*cp in {1, 2, 4}; the K/V schemes on the same mesh do not have the rule
    (M5 at cp=8 and M6 at cp=4 x tp=2 are valid: seq_len 16 is a multiple of tp*2*cp = 16)."""
    with pytest.raises(ValueError) as error:
        RECIPES[recipe].validate(**degrees)
    assert str(error.value).startswith(message)
    assert "valid cp for" in str(error.value)
    RECIPES[recipe.replace("-U", "")].validate(**degrees)


@pytest.mark.parametrize("recipe", [name for name, row in RECIPES.items() if row.workload.preset is not None])
def test_the_cost_model_describes_the_model_the_facts_name(recipe):
    """A row's workload facts are what the cost model builds its model from: the preset's architecture and
    the facts' parallel style (the collectives counted from the same facts are checked against the traces
    in test_recipe_matches_reference)."""
    from hyper_parallel.cost_model import get_model, recipe_model

    facts, model = RECIPES[recipe].workload, recipe_model(recipe)
    assert model.is_moe == facts.moe and model.architecture == get_model(facts.preset).architecture
    assert (model.param_shard, model.sequence_parallel) == (facts.param_shard, facts.sequence_parallel)
    assert (model.sequence_scheme, model.dispatch) == (facts.sequence_scheme, facts.dispatch)


def test_each_small_preset_has_one_recipe_for_the_plan_command():
    """``launch plan`` prints a recipe's worker for the small presets: one recipe each, valid on its own default."""
    from hyper_parallel.cost_model import PRESETS
    from hyper_parallel.recipes.registry import plan_recipe

    for preset in ("small", "small-moe", "small-mlp"):
        chosen = [row for row in RECIPES.values() if row.plan_command and row.workload.preset == preset]
        assert len(chosen) == 1 and plan_recipe(preset) is chosen[0], preset
        chosen[0].validate(**chosen[0].default)
    assert all(plan_recipe(name) is None for name in PRESETS if not name.startswith("small"))


@pytest.mark.distributed
@pytest.mark.parametrize("degrees", [{"world_size": 4, "cp": 4}])
def test_ring_keeps_fewer_activations_than_the_all_gather(degrees, recipe_results):
    """Measured on the runs (rank 0, bytes autograd saves for backward, recipes.activation_memory): the
    ring keeps its own K/V, one more block and a log-sum-exp per query where the all-gather keeps the
    whole sequence's K/V and every probability, so M5-R holds less than the all-gather CP on one mesh
    (tests/test_cp_attention.py has the per-call bytes by hand). On cp = 2 the one more block is the whole
    other half of the sequence, and the two differ by less than the measurement moves between runs (a few
    %: 370,564 against 385,028 B in one run, 395,012 against 389,124 in another), so only cp = 4 is held."""
    ring = result_of("M5-R", degrees, recipe_results)
    gather = result_of("M5" if degrees["cp"] == 2 else "A-CP", degrees, recipe_results)
    assert ring.ok and gather.ok, (ring.error, gather.error)
    assert ring.metrics["saved_activation_bytes"] < gather.metrics["saved_activation_bytes"]
