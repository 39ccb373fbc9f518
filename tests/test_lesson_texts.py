"""Small texts the notebooks print or state, each held to a number derived independently.

The trade-off tables' transient-memory row (what DDP holds during backward is gradients, not gathered
parameters), an MoE's routed all-to-all bytes against the cost model (rank 0 differs, the mean over
ranks does not), 07's decision table (rank_size = shard_size x dp_size, and the reduction it names),
and 06's table of what each degree communicates.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from types import SimpleNamespace

import nbformat
import torch

from hyper_parallel.cost_model import estimate, recipe_model
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.models.mlp import MLP, MLPConfig
from hyper_parallel.viz.style import fmt_bytes
from launch.notebook.lessons import GATHERED_LABEL, STATE_AND_TRANSIENT_LABEL, tradeoff_rows
from launch.notebook.tables import gradient_reduction
from launch.notebook.workbook import NOTEBOOKS_DIR


def _rows(recipe: str, degrees: dict, traces: dict | None = None) -> dict[str, list]:
    result = SimpleNamespace(metrics={"recipe": recipe, "degrees": degrees}, traces=traces or {0: []})
    return {row[0]: row for row in tradeoff_rows(result)}


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_the_transient_row_of_ddp_is_one_blocks_gradients_and_of_fsdp_adds_the_gathers():
    """M1 (DDP, 2 ranks) gathers nothing: its transient memory is one block's full float32 gradients while
    that block's backward runs. M4 (FSDP) holds the root gathered from forward to backward, and one block's
    gathered parameters next to that block's full gradients: root + 2 x block."""
    model = MLP(MLPConfig())
    block = _numel(model.blocks[0]) * 4
    root = (_numel(model) - sum(_numel(b) for b in model.blocks)) * 4
    ddp = _rows("M1", dict(world_size=2, dp_replicate=2))[GATHERED_LABEL]
    fsdp = _rows("M4", dict(world_size=2, dp_shard=2))[GATHERED_LABEL]
    assert ddp[2] == fmt_bytes(block)
    assert fsdp[2] == fmt_bytes(root + 2 * block)
    assert "gradients" in GATHERED_LABEL


def _held_at_peak(recipe: str, degrees: dict, n_layers: int | None = None):
    """The cost model's memory for one rank and its parameters + gradients + optimizer + transient."""
    config = recipe_model(recipe)
    if n_layers is not None:
        config = dataclasses.replace(config, n_layers=n_layers)
    memory = estimate(config, ParallelDims(**degrees)).memory
    return memory, memory.parameters + memory.gradients + memory.optimizer + memory.gathered


def test_01_fsdp_holds_less_than_ddp_at_the_peak_as_its_text_says():
    """01's sentence after the M4 trade-off table: its numbers are the tables' (the cost model's) and its
    verdict the sum's: FSDP's transient row is larger, yet parameters + gradients + transient are smaller,
    and the gap grows with the number of blocks."""
    text = _markdown("01_ddp_fsdp")
    sentence = text[text.index("What FSDP buys and what it pays") :].split("\n")[0]
    ddp_degrees, fsdp_degrees = dict(world_size=2, dp_replicate=2), dict(world_size=2, dp_shard=2)
    ddp, ddp_held = _held_at_peak("M1", ddp_degrees)
    fsdp, fsdp_held = _held_at_peak("M4", fsdp_degrees)
    assert fsdp_held < ddp_held and fsdp.gathered > ddp.gathered
    assert fsdp.activations == ddp.activations and ddp.optimizer == fsdp.optimizer == 0
    assert _rows("M1", ddp_degrees)[STATE_AND_TRANSIENT_LABEL][2] == fmt_bytes(ddp_held)
    assert _rows("M4", fsdp_degrees)[STATE_AND_TRANSIENT_LABEL][2] == fmt_bytes(fsdp_held)
    quoted = [fmt_bytes(n) for n in (fsdp.gathered, ddp.gathered, fsdp_held, ddp_held, fsdp.activations)]
    assert re.findall(r"\d+\.\d KiB", sentence) == quoted, sentence
    gaps = [_held_at_peak("M1", ddp_degrees, n)[1] - _held_at_peak("M4", fsdp_degrees, n)[1] for n in (2, 4, 8)]
    assert gaps == sorted(gaps) and len(set(gaps)) == 3, gaps
    assert "larger than DDP" not in text


def _event(op, group, nbytes, phase="forward"):
    return {
        "kind": "collective",
        "op": op,
        "group": group,
        "ranks": [0, 1, 2, 3],
        "bytes": nbytes,
        "phase": phase,
        "step": 1,
    }


def test_routed_all_to_all_bytes_are_checked_by_their_mean_over_ranks():
    """S1's cost model gives the balanced all-to-all bytes on ep; ranks that receive 10 % more and 10 %
    less average to it exactly: the row says routing and checks the mean, a real mismatch stays ≠ model."""
    degrees = dict(world_size=4, dp_shard=4, ep=2)
    model = estimate(recipe_model("S1"), ParallelDims(**degrees)).by_op_group()[("all_to_all", "ep")]
    more, less = _event("all_to_all", "ep", model * 1.1), _event("all_to_all", "ep", model * 0.9)
    cell = _rows("S1", degrees, {0: [more], 1: [less], 2: [more], 3: [less]})["communicated: all_to_all on ep"][4]
    assert cell.startswith(fmt_bytes(model * 1.1)) and "routing" in cell and cell.endswith("✔)")
    wrong = _rows("S1", degrees, {r: [more] for r in range(4)})["communicated: all_to_all on ep"][4]
    assert wrong.endswith("≠ model")


def _markdown(name: str) -> str:
    nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    return "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")


def test_02_decision_table_names_sizes_and_the_reduction_they_imply():
    text = _markdown("07_fully_shard_groupinfo")
    examples = re.findall(r"rank_size (\d+), shard_size (\d+), dp_size (\d+) -> ([A-Z()0-9+ ]+?) \|", text)
    assert len(examples) == 3, examples
    for rank, shard, dp, reduction in examples:
        assert int(rank) == int(shard) * int(dp)
        assert gradient_reduction(int(shard), int(dp)) == reduction.strip()
    assert not re.search(r"\brank \d+, shard \d+", text)


def test_01_table_gives_what_each_degree_communicates():
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \|$", _markdown("06_mesh_algebra"), re.MULTILINE)
    }
    assert "send/recv" in rows["pp"] and "gradients" in rows["pp"]
    assert "all-to-all" in rows["cp"] and "reduce-scatter" in rows["cp"]


def _scatters(units: list[str], times: int) -> list[dict]:
    return [
        {**_event("reduce_scatter", "fsdp", 64, "backward"), "module": unit} for _ in range(times) for unit in units
    ]


def test_pipeline_reduction_text_counts_what_the_trace_holds():
    """3 units on rank 0 of P1, 4 microbatches: 3 reduce-scatters is once per step, 12 once per microbatch."""
    from launch.notebook.tables import pipeline_reduction_text

    units = ["root", "layers.0", "layers.1"]
    once = pipeline_reduction_text({0: _scatters(units, 1)}, microbatches=4)
    every = pipeline_reduction_text({0: _scatters(units, 4)}, microbatches=4)
    assert "3 times on fsdp in the last step, over 3 units: once per unit and step" in once
    assert "12 times on fsdp in the last step, over 3 units: once per unit and microbatch (4 x 3): 4x" in every


def test_15_1_smallest_microbatches_for_a_bubble():
    """p = 2: 1/(m+1) <= 0.1 first holds at m = 9 (m = 8 leaves 11 %)."""
    from hyper_parallel.cost_model.pipeline import bubble_fraction
    from launch.notebook.exercises import EXERCISES, RIGHT, WRONG, check, microbatches_for_bubble

    truth = microbatches_for_bubble("1f1b", 2, 0.10)
    assert truth == 9 and bubble_fraction("1f1b", 2, 8) > 0.10 >= bubble_fraction("1f1b", 2, 9)
    assert EXERCISES["09.1"].solution.startswith("9")
    assert check("09.1", 9, truth) == RIGHT and check("09.1", 8, truth) == WRONG


def test_00_glossary_defines_the_workbooks_words_as_parallel_dims_computes_them():
    """Every word later notebooks use is in 00's glossary, and its formulas are ParallelDims' own."""
    text = _markdown("00_start_here")
    for word in ("**unit**", "**root**", "**`shard_size`**", "**`dp_size`**", "**`rank_size`**", "**`efsdp`**"):
        assert word in text, word
    for word in ("`dp_cp`", "**full-buffer bytes**", "**wire bytes**", "`fsdp = dp_shard * cp`"):
        assert word in text, word
    assert "`efsdp = dp_shard * cp * tp / (ep * etp)`" in text and "`dp_replicate * dp_shard * cp`" in text
    for degrees in (dict(world_size=8, dp_shard=8, ep=2), dict(world_size=4, dp_shard=2, tp=2, ep=2, etp=2)):
        dims = ParallelDims(**degrees)
        assert dims.efsdp == dims.dp_shard * dims.cp * dims.tp // (dims.ep * dims.etp)
        assert dims.dp_cp == dims.dp_replicate * dims.dp_shard * dims.cp and dims.fsdp == dims.dp_shard * dims.cp


def test_00_offers_the_short_route_in_order():
    text = (
        _markdown("00_start_here") + nbformat.read(NOTEBOOKS_DIR / "00_start_here.ipynb", as_version=4).cells[0].source
    )
    route = text[text.index("**The short route**") :].split("\n\n")[0]
    names = ["`01_ddp_fsdp`", "`03_tensor_sequence_parallel`", "`12_your_own_model`"]
    assert [route.index(n) for n in names] == sorted(route.index(n) for n in names)
    section = re.search(r"bytes per\s+parameter of section (\d+) of `02_memory`", route)
    assert section, route
    assert f"## {section.group(1)} · Bytes per parameter" in _markdown("02_memory")


def test_a_benchmark_ratio_inside_its_quartiles_is_called_noise():
    """91's line per configuration: 1.06 [0.97-1.18] contains 1 (no measurable difference); [1.02-1.10]
    does not (ours slower in at least 3 of 4 pairs), nor [0.80-0.95] (ours faster)."""
    from launch.notebook.tables import ratio_verdict

    assert "within the noise" in ratio_verdict({"q1": 0.97, "median": 1.06, "q3": 1.18})
    assert "ours slower" in ratio_verdict({"q1": 1.02, "median": 1.05, "q3": 1.10})
    assert "ours faster" in ratio_verdict({"q1": 0.80, "median": 0.90, "q3": 0.95})


def test_hint_13_2_state_is_the_cost_models_unsharded_state():
    """13.2's hint: 8.0e9 parameters x 16 B are about 120 GiB before sharding: the cost model's ZeRO-0 state of
    llama-8b-like (bf16-adam: 4 + 4 + 8 B per parameter) rounds to the same 120 GiB."""
    from hyper_parallel.cost_model import get_model
    from launch.notebook.exercises import EXERCISES
    from launch.notebook.memory_lesson import zero_stages

    hint = EXERCISES["05.2"].hint
    assert "8.0e9 parameters x 16 B" in hint and "about 120 GiB" in hint
    state = zero_stages(get_model("llama-8b-like"), dp=1)["ZeRO-0 (DDP)"]
    assert round(state / 2**30, -1) == 120


def test_08_s2_draws_an_expert_weight_that_nothing_gathers():
    """08's S2 placements figure names an expert weight of the MoE model S2 trains, shaped [num_experts,
    d_model, hidden] as the text says, on a mesh whose efsdp is 1 (the text: nothing is gathered)."""
    from hyper_parallel.models.transformer import Transformer
    from hyper_parallel.recipes.moe import MOE_CONFIG

    nb = nbformat.read(NOTEBOOKS_DIR / "08_moe_expert_parallel.ipynb", as_version=4)
    code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    parameters = next(cell.source for cell in nb.cells if "parameters" in cell.metadata.get("tags", []))
    s2 = ast.literal_eval(re.search(r"^s2 = (\{.*\})$", parameters, re.M).group(1))
    name = re.search(r'show_figures\(\s*results\["S2"\].*?param="([^"]+)"', code, re.S).group(1)
    weight = dict(Transformer(MOE_CONFIG).named_parameters())[name]
    assert ".experts." in name
    assert tuple(weight.shape) == (MOE_CONFIG.num_experts, MOE_CONFIG.d_model, MOE_CONFIG.moe_hidden)
    assert ParallelDims(**s2).efsdp == 1 and "`efsdp = 1` nothing is gathered" in _markdown("08_moe_expert_parallel")
