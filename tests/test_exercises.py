"""The exercises' checkers (launch.notebook.exercises) and what the notebooks put on the page (launch.notebook.lessons).

Every exercise is checked with a right and a wrong answer against a truth computed independently of
the checker: the cost model's counts for the recipes' default meshes, hand-made traces with known
counts and bytes, ParallelDims' rules, ``cp_chunks``. ``None`` (not answered yet) must pass quietly
with the hint, because papermill runs every notebook with its answers open.
"""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace

import pytest

from hyper_parallel.cost_model import estimate, get_model, recipe_model
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes import registry
from hyper_parallel.viz import cp_chunks
from launch.notebook.exercises import (
    EXERCISES,
    RIGHT,
    UNANSWERED,
    WRONG,
    all_reduce_share,
    ask,
    check,
    check_fits,
    check_layout,
    collective_count,
    drifted,
    fewer_saved_activations,
    show_solution,
    tp_wire_bytes,
    units_not_regathered,
    wire_bytes_per_rank,
)
from launch.notebook.lessons import recipe_sources, tradeoff_rows

DEFAULTS = {
    "M1": dict(world_size=2, dp_shard=2),
    "M4": dict(world_size=2, dp_shard=2),
    "M2": dict(world_size=2, tp=2),
    "M7": dict(world_size=4, dp_replicate=2, dp_shard=2),
    "S1": dict(world_size=4, dp_shard=4, ep=2),
    "S2": dict(world_size=4, dp_shard=2, tp=2, ep=2, etp=2),
}
COUNTED = {  # exercise: (recipe, op, group, phase, the count its solution states)
    "00.1": ("M4", "reduce_scatter", None, None, 3),
    "01.1": ("M4", "all_gather", None, None, 5),
    "03.1": ("M2", "all_reduce", "tp", "forward", 5),
    "05.1": ("M7", "all_gather", None, None, 5),
    "08.1": ("S1", "all_to_all", "ep", None, 5),
    "08.2": ("S1", None, "efsdp", None, 3),
}


def _cost_model_count(recipe, op, group, phase):
    counts = estimate(recipe_model(recipe), ParallelDims(**DEFAULTS[recipe])).counts()
    return sum(
        n
        for (o, g, p), n in counts.items()
        if (op is None or o == op) and (group is None or g == group) and (phase is None or p == phase)
    )


@pytest.mark.parametrize("key", sorted(COUNTED))
def test_count_exercises_right_and_wrong_against_the_cost_model(key, capsys):
    recipe, op, group, phase, stated = COUNTED[key]
    truth = _cost_model_count(recipe, op, group, phase)  # the runs' traces equal these (test_cost_model.py)
    assert truth == stated and EXERCISES[key].solution.startswith(str(stated))
    assert check(key, stated, truth) == RIGHT
    assert check(key, stated + 1, truth) == WRONG
    assert check(key, "five", truth) == WRONG
    assert "Hint:" in capsys.readouterr().out


def _event(op, group, ranks, nbytes, phase="forward", step=1, module="root"):
    return {
        "module": module,
        "kind": "collective",
        "op": op,
        "group": group,
        "ranks": ranks,
        "bytes": nbytes,
        "phase": phase,
        "step": step,
    }


def test_collective_count_reads_the_last_step_of_a_trace():
    """Two steps on rank 0: step 0 has 4 all-gathers, step 1 (the last) 3 and one reduce-scatter;
    init-phase collectives never count."""
    events = (
        [_event("all_gather", "fsdp", [0, 1], 8, step=0)] * 4
        + [_event("all_gather", "fsdp", [0, 1], 8)] * 3
        + [_event("reduce_scatter", "fsdp", [0, 1], 8, "backward"), _event("all_gather", "fsdp", [0, 1], 8, "init")]
    )
    traces = {0: events}
    assert collective_count(traces, "all_gather") == 3
    assert collective_count(traces, "all_gather", phase="backward") == 0
    assert collective_count(traces, group="fsdp") == 4
    assert collective_count(traces, group="efsdp") == 0


def test_wire_bytes_on_tp_and_11_2_right_and_wrong(capsys):
    """2 ranks: an all-reduce of 1000 B sends 2(n-1)/n = 1000 B, an all-gather and a reduce-scatter of
    1000 B send 500 B each: two all-reduces and two AG + RS pairs send the same 2000 B on tp; the fsdp
    all-gather is not on tp. 03.2 asks for the run that saved fewer activation bytes."""
    runs = {
        "M2": {0: [_event("all_reduce", "tp", [0, 1], 1000)] * 2 + [_event("all_gather", "fsdp", [0, 1], 800)]},
        "M3": {0: [_event("all_gather", "tp", [0, 1], 1000), _event("reduce_scatter", "tp", [0, 1], 1000)] * 2},
    }
    assert wire_bytes_per_rank(runs["M2"]) == 2400 and wire_bytes_per_rank(runs["M3"]) == 2000
    assert (
        tp_wire_bytes(SimpleNamespace(traces=runs["M2"])) == tp_wire_bytes(SimpleNamespace(traces=runs["M3"])) == 2000
    )
    results = {label: SimpleNamespace(metrics={"saved_activation_bytes": n}) for label, n in (("M2", 900), ("M3", 700))}
    truth = fewer_saved_activations(results, ["M2", "M3"])
    assert check("03.2", "M3", truth) == RIGHT and check("03.2", "m3", truth) == RIGHT
    assert check("03.2", "M2", truth) == WRONG


def test_10_2_the_unit_not_gathered_again_in_backward():
    """M4's last step as its trace has it: every unit all-gathers in forward, only the blocks again in
    backward (a step-0 backward gather of the root does not count: only the last step is read)."""
    gathers = [_event("all_gather", "fsdp", [0, 1], 8, "forward", module=m) for m in ("root", "blocks.0", "blocks.1")]
    gathers += [_event("all_gather", "fsdp", [0, 1], 8, "backward", module=m) for m in ("blocks.1", "blocks.0")]
    gathers += [_event("all_gather", "fsdp", [0, 1], 8, "backward", step=0, module="root")]
    truth = units_not_regathered(SimpleNamespace(traces={0: gathers}))
    assert truth == {"root"}
    assert check("01.2", "root", truth) == RIGHT and check("01.2", {"root"}, truth) == RIGHT
    assert check("01.2", "blocks.0", truth) == WRONG


def test_02_1_all_reduce_carries_one_shard_of_the_reduce_scatter():
    """HSDP with fsdp = 2: each unit reduce-scatters a 1000 B buffer and all-reduces its 500 B shard."""
    events = [
        _event("reduce_scatter", "fsdp", [0, 1], 1000, "backward"),
        _event("all_reduce", "dp_replicate", [0, 2], 500, "backward"),
    ] * 3
    truth = all_reduce_share(SimpleNamespace(traces={0: events}))
    assert truth == 0.5
    assert check("07.1", 0.5, truth) == RIGHT and check("07.1", 1.0, truth) == WRONG
    with pytest.raises(ValueError, match="HSDP"):
        all_reduce_share(SimpleNamespace(traces={0: [_event("all_reduce", "tp", [0, 1], 8, "backward")]}))


def test_13_2_fits_right_and_wrong():
    """llama-8b-like, N parameters: fp32 parameters and gradients (4 + 4 B) and Adam's two fp32 states
    (8 B) are 16 N bytes, divided by dp_shard: about 119.7 GiB / dp_shard, so dp_shard 8 keeps
    15.0 GiB (fits 16), dp_shard 4 keeps 29.9 GiB (does not)."""
    n = estimate(get_model("llama-8b-like"), ParallelDims(world_size=1)).parameter_count
    assert 16 * n / 8 / 2**30 < 16 < 16 * n / 4 / 2**30
    kwargs = dict(model="llama-8b-like", world_size=64, budget_gib=16, need={"dp_replicate": ">1", "tp": 1, "cp": 1})
    assert check_fits("05.2", {"dp_replicate": 8, "dp_shard": 8}, **kwargs) == RIGHT
    assert check_fits("05.2", {"dp_replicate": 4, "dp_shard": 16}, **kwargs) == RIGHT
    assert check_fits("05.2", {"dp_replicate": 16, "dp_shard": 4}, **kwargs) == WRONG  # 29.9 GiB
    assert check_fits("05.2", {"dp_replicate": 1, "dp_shard": 64}, **kwargs) == WRONG  # fits, but not HSDP
    assert check_fits("05.2", {"dp_replicate": 3, "dp_shard": 3}, **kwargs) == WRONG  # 9 != 64 ranks
    assert check_fits("05.2", "dp_shard=8", **kwargs) == WRONG
    assert check_fits("05.2", None, **kwargs) == UNANSWERED


def test_12_1_right_and_wrong():
    """The capstone's 2 blocks: 2 row-wise all-reduces in forward and 2 input-gradient all-reduces in
    backward per block (tests/test_capstone.py holds the trace to the same count)."""
    blocks, per_block = 2, 2 + 2
    assert EXERCISES["12.1"].solution.startswith(f"{blocks * per_block}:")
    assert check("12.1", 8, blocks * per_block) == RIGHT and check("12.1", 4, blocks * per_block) == WRONG


def test_11_1_layout_right_and_wrong():
    """llama-8b-like (global batch 512) on 4096 GPUs of 8: dp = 4096 / (tp * cp * pp) must divide 512, so
    model parallelism of 8 at least; the solution's layouts are checked against the ranking, and one rule
    (memory, global batch, speed) at a time is broken."""
    from hyper_parallel.cost_model.hardware import get_hardware
    from hyper_parallel.cost_model.ranking import rank_layouts
    from launch.notebook.planning_lesson import procedure_rows

    config, machine = get_model("llama-8b-like"), get_hardware("h100-sxm")
    assert config.global_batch == 512 and 4096 // 512 == 8  # the solution's numbers
    ranked = rank_layouts(config, 4096, 8, machine)
    best = ParallelDims(world_size=4096, dp_replicate=64, dp_shard=8, tp=8)
    assert ranked[0].dims == best  # "the planner's first"
    check_it = lambda answer, ranking=ranked: check_layout("11.1", answer, ranking, 4096)  # noqa: E731
    assert check_it({"dp_replicate": 64, "dp_shard": 8, "tp": 8}) == RIGHT
    assert check_it({"dp_replicate": 128, "dp_shard": 4, "tp": 8}) == RIGHT  # "its neighbours step as fast"
    assert check_it({"dp_replicate": 32, "dp_shard": 16, "tp": 8}) == RIGHT
    fsdp = next(r for r in ranked if r.dims == ParallelDims(world_size=4096, dp_shard=512, tp=8))
    assert fsdp.fits and 2.5 < fsdp.step_seconds / ranked[0].step_seconds < 3.5  # "about 3x the best step"
    assert check_it({"dp_shard": 512, "tp": 8}) == WRONG  # one ring of 512 ranks (step 3)
    assert check_it({"dp_shard": 4096}) == WRONG  # dp 4096 does not divide 512 sequences (step 2)
    assert check_it({"dp_shard": 512, "cp": 2, "tp": 4}) == WRONG  # fits, waits for more communication
    slower = next(r for r in ranked if r.dims == ParallelDims(world_size=4096, dp_shard=512, cp=2, tp=4))
    assert slower.fits and slower.exposed_seconds > ranked[0].exposed_seconds
    assert check_it({"dp_shard": 512, "tp": 9}) == WRONG and check_it("tp=8") == WRONG
    assert check_it(None) == UNANSWERED
    small = rank_layouts(config, 4096, 8, machine.replace(memory_gib=12))  # best layout: 13 GiB, over budget
    assert not next(r for r in small if r.dims == best).fits
    assert check_it({"dp_replicate": 64, "dp_shard": 8, "tp": 8}, small) == WRONG
    rows = {(r.tp, r.cp, r.pp): r for r in procedure_rows(config, 4096, ranked, 8)}
    assert rows[(8, 1, 1)].verdict == "a candidate" and rows[(8, 1, 1)].sequences_per_dp_rank == 1
    assert rows[(4, 1, 1)].verdict == "fails step 2 (global batch)"  # dp 1024 > 512 sequences


def test_12_1_03_and_90_right_and_wrong():
    chunks = set(cp_chunks(4)[1])  # 8 chunks: rank 1 holds 1 and 2*4-1-1 = 6
    assert chunks == {1, 6}
    assert check("04.1", {6, 1}, chunks) == RIGHT and check("04.1", [1, 6], chunks) == RIGHT
    assert check("04.1", {1, 2}, chunks) == WRONG
    spread = {"blocks.0.norm.weight": 3e-4, "blocks.0.w2.bias": 1e-5, "blocks.0.w1.weight": 0.0}
    assert check("10.1", {"blocks.0.norm.weight", "blocks.0.w2.bias"}, drifted(spread)) == RIGHT
    assert check("10.1", {"blocks.0.norm.weight"}, drifted(spread)) == WRONG
    assert check("10.2", 2, 2) == RIGHT and check("10.2", 3, 2) == WRONG
    assert EXERCISES["10.2"].solution.startswith("2")  # measured: 0 -> 2 all-reduces on tp (two block units)
    with pytest.raises(ValueError, match="ep % \\(cp\\*tp\\)|cp\\*tp|ep="):
        ParallelDims(world_size=8, dp_shard=2, cp=2, tp=2, ep=2, etp=1)
    efsdp = ParallelDims(world_size=8, dp_shard=8, ep=2).efsdp  # 8 ranks / ep 2 = 4
    assert efsdp == 4 and check("06.1", 4, efsdp) == RIGHT and check("06.1", 2, efsdp) == WRONG
    valid = ParallelDims(world_size=16, dp_shard=4, cp=2, tp=2, ep=4, etp=1).ep == 4  # 90.1's mesh builds
    assert valid and EXERCISES["90.1"].solution.startswith("True")
    assert check("90.1", True, valid) == RIGHT
    assert check("90.1", False, valid) == WRONG and check("90.1", "True", valid) == WRONG
    with pytest.raises(ValueError, match="multiple of cp\\*tp=4"):  # its solution's counter-example
        ParallelDims(world_size=16, dp_shard=4, cp=2, tp=2, ep=2, etp=1)


def test_95_1_block_collectives_of_a_benchmark_row():
    """HSDP per block: 2 AG + 1 RS on fsdp and 1 AR on dp_replicate = 4 (the root 3, the tp all-gather
    of an FSDP+TP block is not on an FSDP group)."""
    from collections import Counter

    block = Counter(
        {
            ("all_gather", "fsdp"): 2,
            ("reduce_scatter", "fsdp"): 1,
            ("all_reduce", "dp_replicate"): 1,
            ("all_gather", "tp"): 3,
        }
    )
    root = Counter({("all_gather", "fsdp"): 1, ("reduce_scatter", "fsdp"): 1, ("all_reduce", "dp_replicate"): 1})
    row = {
        "config": "HSDP",
        "communication": {"ours": {"per_unit": {"root": root, "layers.0": block, "layers.1": block}}},
    }
    bench = SimpleNamespace(rows=[row])
    from launch.notebook.exercises import block_collectives

    truth = block_collectives(bench, "HSDP")
    assert truth == 4
    assert check("91.1", 4, truth) == RIGHT and check("91.1", 3, truth) == WRONG
    with pytest.raises(ValueError, match="no configuration"):
        block_collectives(bench, "FSDP")
    row["communication"]["ours"]["per_unit"]["layers.1"] = root
    with pytest.raises(ValueError, match="different numbers"):
        block_collectives(bench, "HSDP")


def test_03_3_async_tp_collectives_from_the_hand_derived_counts():
    """The counts test_recipes holds every run to: M3 issues 11 tp collectives in forward, M3-A 19."""
    from test_recipes import expected_collectives

    def forward_tp(recipe):
        counts = expected_collectives(recipe, {"world_size": 2, "tp": 2})
        return sum(n for (op, group, phase), n in counts.items() if group == "tp" and phase == "forward")

    assert forward_tp("M3") == 11 and "11 collectives" in EXERCISES["03.3"].question
    truth = forward_tp("M3-A")
    assert truth == 19 and EXERCISES["03.3"].solution.startswith("19")
    assert check("03.3", 19, truth) == RIGHT and check("03.3", 11, truth) == WRONG


def test_03_4_float8_gather_share_of_a_trace():
    """Block gathers of 4 x 16 values: 64 B in e4m3 against 256 B in float32; the head's float32 gather of
    the float8 run and a root gather are not block gathers."""
    from launch.notebook.exercises import float8_gather_share

    def result(dtype, nbytes):
        events = [{**_event("all_gather", "tp", [0, 1], nbytes, module="layers.0"), "dtype": dtype}]
        events.append({**_event("all_gather", "tp", [0, 1], 512, module="root"), "dtype": "float32"})
        return SimpleNamespace(traces={0: events})

    truth = float8_gather_share(result("float8_e4m3fn", 64), result("float32", 256))
    assert truth == 0.25 and EXERCISES["03.4"].solution.startswith("0.25")
    assert check("03.4", 0.25, truth) == RIGHT and check("03.4", 1 / 4, truth) == RIGHT
    assert check("03.4", 0.5, truth) == WRONG


def test_every_exercise_is_tested_and_unanswered_passes(capsys):
    tested = set(COUNTED) | {"03.2", "01.2", "05.2", "04.1", "10.1", "10.2", "07.1", "90.1", "91.1", "06.1"}
    tested |= {"03.3", "03.4"}
    tested |= {"09.1"}  # tests/test_lesson_texts.py
    tested |= {"11.1", "12.1"}
    tested |= {"04.2", "04.3", "09.2"}  # tests/test_sequence_lessons.py
    tested |= {"00b.1", "00b.2"}  # tests/test_alpha_beta.py
    assert tested == {key for key in EXERCISES if not key.startswith("02.")}  # 02: the memory notebook's tests
    for key in EXERCISES:
        assert check(key, None, 1) == UNANSWERED
        assert EXERCISES[key].hint in capsys.readouterr().out
        assert "<details>" in show_solution(key).data and key in ask(key).data
    with pytest.raises(ValueError, match="unknown exercise"):
        check("99.9", 1, 1)


# ---------------------------------------------------------------- launch.notebook.lessons


@pytest.mark.parametrize("recipe", [name for name, spec in registry.RECIPES.items() if spec.code])
def test_recipe_code_is_the_code_that_runs(recipe):
    """The listing is read without importing the modules; it must equal inspect.getsource of the
    imported functions, and name the calls the lesson points at."""
    sources = recipe_sources(recipe)
    for path, source in sources:
        module, name = path.split(":")
        assert source == inspect.getsource(getattr(importlib.import_module(module), name)), path
    text = "".join(source for _, source in sources)
    assert "fully_shard(" in text
    if recipe == "M1":
        assert "enable_param_shard=False" in text
    if recipe in ("M2", "M3"):  # a dense model's listing: the MoE block's plan is not one to read past
        assert "ColwiseParallel()" in text and "SequenceParallel()" in text
        assert "PrepareModuleOutput" not in text and "use_local_output" not in text
    with pytest.raises(ValueError):
        recipe_sources("M99")


def test_tradeoff_rows_shrink_by_dp_shard_and_match_the_trace():
    """M4 on 2 ranks: parameters and gradients halve against one rank; the communicated rows carry the
    cost model's bytes, and a trace with exactly those bytes is marked ✔, one with other bytes not."""
    model = estimate(recipe_model("M4"), ParallelDims(**DEFAULTS["M4"]))
    events = [_event(op, group, [0, 1], nbytes) for (op, group), nbytes in model.by_op_group().items()]
    result = SimpleNamespace(metrics={"recipe": "M4", "degrees": DEFAULTS["M4"]}, traces={0: events})
    rows = {row[0]: row for row in tradeoff_rows(result)}
    assert rows["parameters per rank"][3] == "shrinks ÷2" and rows["gradients per rank"][3] == "shrinks ÷2"
    assert rows["communicated: all_gather on fsdp"][4].endswith("✔")
    assert rows["communicated: reduce_scatter on fsdp"][4].endswith("✔")
    events[0] = dict(events[0], bytes=events[0]["bytes"] + 4)
    rows = {row[0]: row for row in tradeoff_rows(result)}
    assert any(row[4].endswith("≠ model") for row in rows.values())
