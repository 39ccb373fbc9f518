"""What the notebooks put on the page besides figures: a recipe's own code, and its trade-offs in numbers.

    recipe_code("M4")          the functions that parallelize the recipe (``inspect.getsource``), and the
                               torch calls they make or stand for
    tradeoff_table(result)     what shrinks, what grows and what is communicated, one rank against this
                               run: the cost model's numbers next to the run's own traced bytes

A learner should never have to trust a black box: ``run_recipes({...})`` runs exactly the code shown
here, and the trade-off table's bytes are checked against the trace of the same run.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from hyper_parallel.recipes import registry

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the repository: launch/notebook/lessons.py


def function_source(path: str) -> str:
    """The source of ``"module:function"`` read from its file (``ast``; the same text as
    ``inspect.getsource``) without importing the module: a recipe module imports torch and the
    distributed stack, seconds on a loaded machine for a cell that only shows code."""
    module, name = path.split(":")
    file = PACKAGE_ROOT.joinpath(*module.split(".")).with_suffix(".py")
    if not file.exists():
        raise ValueError(f"no module file {file} for {path!r}")
    text = file.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "".join(text.splitlines(keepends=True)[start - 1 : node.end_lineno])
    raise ValueError(f"no function {name!r} in {file}")


def recipe_sources(recipe: str) -> list[tuple[str, str]]:
    """(``module:function``, its source) of the recipe's implementation and of the functions it calls
    (``Recipe.code``, the registry's row)."""
    spec = registry.get(recipe)
    if not spec.code:
        listed = [name for name, other in registry.RECIPES.items() if other.code]
        raise ValueError(f"no code listing for recipe {spec.name!r}; listed: {listed}")
    paths = [spec.implementation, *spec.code]
    return [(path, function_source(path)) for path in paths]


def recipe_code(recipe: str):
    """The recipe's parallelize code as Markdown, and the torch calls it makes or stands for."""
    from IPython.display import Markdown

    parts = [f"#### The code of {recipe}: what `run_recipes` runs in every worker"]
    for path, source in recipe_sources(recipe):
        parts.append(f"`{path}`\n```python\n{source.rstrip()}\n```")
    calls = registry.get(recipe).torch_calls
    if calls:
        parts.append(
            "| our call | the torch call it makes or stands for |\n| --- | --- |\n"
            + "\n".join(f"| {ours} | {theirs} |" for ours, theirs in calls)
        )
    return Markdown("\n\n".join(parts))


# ---------------------------------------------------------------- trade-offs from the cost model


def _measured_bytes(result, rank: int = 0) -> dict[tuple[str, str], float]:
    traces = result if isinstance(result, dict) else result.traces
    events = [e for e in traces.get(rank, []) if e.get("kind") == "collective" and e.get("phase") != "init"]
    if not events:
        return {}
    last = max(e["step"] for e in events)
    measured: dict[tuple[str, str], float] = {}
    for event in events:
        if event["step"] == last:
            key = (event["op"], event["group"])
            measured[key] = measured.get(key, 0.0) + event["bytes"]
    return measured


GATHERED_LABEL = "gathered parameters + one unit's full gradients (transient)"
"""The cost model's ``memory.gathered``: the all-gathered parameters (none without sharding) plus the
largest unit's unsharded gradients, which every style holds while that unit's backward runs (DDP too)."""


STATE_AND_TRANSIENT_LABEL = "parameters + gradients + optimizer state + transient"
"""The sum a learner compares between styles: what one rank holds at the peak of backward, activations apart
(the same for every data-parallel style of one batch per rank); the recipes train with SGD, no optimizer state."""

_MEMORY_ROWS = (
    ("parameters per rank", lambda memory: memory.parameters),
    ("gradients per rank", lambda memory: memory.gradients),
    (GATHERED_LABEL, lambda memory: memory.gathered),
    (STATE_AND_TRANSIENT_LABEL, lambda memory: memory.total - memory.activations),
    ("activations (estimate)", lambda memory: memory.activations),
)


def _measured_cell(model_bytes: float, result, key: tuple[str, str]) -> str:
    """Rank 0's traced bytes, ✔ when they equal the model. Where routing decides the bytes (an MoE's
    all-to-alls: each rank receives the rows its tokens' experts send back), the model gives the balanced
    value, which is exactly the mean over the ranks: rank 0's bytes are shown with that mean checked."""
    from hyper_parallel.viz.style import fmt_bytes

    traced = _measured_bytes(result).get(key, 0.0)
    if abs(model_bytes - traced) < 0.5:
        return fmt_bytes(traced) + " ✔"
    traces = result if isinstance(result, dict) else result.traces
    per_rank = [_measured_bytes(traces, rank).get(key, 0.0) for rank in sorted(traces)]
    mean = sum(per_rank) / len(per_rank) if per_rank else 0.0
    if len(per_rank) > 1 and abs(model_bytes - mean) < 0.5:
        return f"{fmt_bytes(traced)} (routing; mean over ranks {fmt_bytes(mean)} ✔)"
    return fmt_bytes(traced) + " ≠ model"


def tradeoff_rows(result) -> list[list[Any]]:
    """Rows of ``tradeoff_table``: memory per rank (one rank, this run, change) and bytes per (op, group)
    (cost model, this run's trace on rank 0, last step)."""
    from hyper_parallel.cost_model import estimate, recipe_model
    from hyper_parallel.mesh import ParallelDims
    from hyper_parallel.viz.style import fmt_bytes

    metrics = result.metrics
    recipe, degrees = metrics["recipe"], metrics["degrees"]
    dims = ParallelDims(**{k: v for k, v in degrees.items() if k in ParallelDims.__dataclass_fields__})
    config = recipe_model(recipe)
    here, alone = estimate(config, dims), estimate(config, ParallelDims(world_size=1))
    rows = []
    for label, part in _MEMORY_ROWS:
        a, b = part(alone.memory), part(here.memory)
        change = (
            "same" if a == b else (f"shrinks ÷{a / b:.3g}" if b and b < a else f"grows ×{b / a:.3g}" if a else "grows")
        )
        rows.append([label, fmt_bytes(a), fmt_bytes(b), change, ""])
    measured = _measured_bytes(result)
    for key in sorted(set(here.by_op_group()) | set(measured)):
        model_bytes = here.by_op_group().get(key, 0.0)
        rows.append(
            [
                f"communicated: {key[0]} on {key[1]}",
                "—",
                fmt_bytes(model_bytes),
                "new",
                _measured_cell(model_bytes, result, key),
            ]
        )
    return rows


def tradeoff_table(result, label: str | None = None):
    """What shrinks, what grows, what is communicated: this run against one rank training alone."""
    from launch.tables import table

    label = label or result.metrics["recipe"]
    return table(
        ["per rank, one step", "one rank alone", label, "change", "measured (rank 0, last step)"],
        tradeoff_rows(result),
        caption=f"{label}: the cost model (hyper_parallel.cost_model.estimate) for one rank and for this "
        "mesh; bytes are full collective buffers, the last column the run's own trace",
    )


def activation_reconciliation_rows(results: dict, labels: list[str]) -> list[list[str]]:
    """Rows of ``activation_reconciliation_table``: from the trade-off table's activations to the bytes each
    run saved (``cost_model.eager_saved``), the last row the run's own measurement, ✔ when equal."""
    from hyper_parallel.cost_model import recipe_model
    from hyper_parallel.cost_model.eager_saved import activation_reconciliation
    from hyper_parallel.mesh import ParallelDims
    from hyper_parallel.viz.style import fmt_bytes

    columns = []
    for label in labels:
        metrics = results[label].metrics
        degrees = metrics["degrees"]
        dims = ParallelDims(**{k: v for k, v in degrees.items() if k in ParallelDims.__dataclass_fields__})
        columns.append(activation_reconciliation(recipe_model(metrics["recipe"], metrics.get("options")), dims))
    rows = []
    for index, (what, _) in enumerate(columns[0]):
        signed = [column[index][1] for column in columns]
        rows.append([what] + [("" if index == 0 else "+ " if n >= 0 else "− ") + fmt_bytes(abs(n)) for n in signed])
    expected = [sum(n for _, n in column) for column in columns]
    rows.append(["= what the eager code saves"] + [fmt_bytes(n) for n in expected])
    measured = [results[label].metrics["saved_activation_bytes"] for label in labels]
    rows.append(
        ["measured: saved tensors at the end of forward (rank 0)"]
        + [fmt_bytes(m) + (" ✔" if m == e else " ≠") for m, e in zip(measured, expected)]
    )
    return rows


def activation_reconciliation_table(results: dict, labels: list[str]):
    """The trade-off table's activation estimate against what each run measured, item by item."""
    from launch.tables import table

    return table(
        ["per rank, one step", *labels],
        activation_reconciliation_rows(results, labels),
        caption="activations: the cost model (a fused production stack at its peak) against what autograd "
        "kept in this eager run (hyper_parallel.cost_model.eager_saved)",
    )
