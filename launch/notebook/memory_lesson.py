"""Notebook 02_memory's predictions, all from the cost model, and the table that puts them beside a run.

The run is ``hyper_parallel.benchmark.memory_probe`` (M4's MLP with Adam under our ``fully_shard``);
the predictions are ``hyper_parallel.cost_model`` for the same model, mesh and knobs:

    parameters, gradients, optimizer   ``estimate(...).memory`` (exact: the sharded state, padding included)
    kept_gathered                      the units that do not reshard after forward (the root, or every unit
                                       with reshard_after_forward=False): their all-gather buffers, held
                                       from forward to backward
    saved_activations                  ``memory.activations`` (an estimate of what a fused kernel keeps)
    all_gathers, reduce_scatters       ``estimate(...).counts()``

ZeRO stages 1 and 2 are not layouts fully_shard builds; ``zero_stages`` derives them from the same
bytes per parameter, and checks stage 3 against the cost model's fully_shard and stage 0 against its DDP.
"""

from __future__ import annotations

from dataclasses import replace

from hyper_parallel.cost_model import PRECISIONS, ModelConfig, Precision, estimate, recipe_model
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.viz.style import fmt_bytes

PARTS = ("parameters", "gradients", "optimizer", "kept_gathered", "saved_activations")
EXACT = ("parameters", "gradients", "optimizer", "kept_gathered", "all_gathers", "reduce_scatters")
"""What the cost model predicts exactly; saved activations are its documented estimate."""


def probe_model(reshard_after_forward: bool = True, micro_batches: int = 1) -> ModelConfig:
    """M4's MLP as the probe trains it: Adam (fp32 state), the given reshard and accumulation."""
    return replace(
        recipe_model("M4"),
        precision=PRECISIONS["fp32-adam"],
        reshard_after_forward=reshard_after_forward,
        grad_accum=micro_batches if micro_batches > 1 else None,
    )


def predicted(world_size: int, reshard_after_forward: bool = True, micro_batches: int = 1) -> dict[str, int]:
    """The cost model's numbers for one rank of ``memory_probe(reshard_after_forward, micro_batches=...)``."""
    config = probe_model(reshard_after_forward, micro_batches)
    cost = estimate(config, ParallelDims(world_size=world_size, dp_shard=world_size))
    counts = cost.counts()
    return {
        "parameters": cost.memory.parameters,
        "gradients": cost.memory.gradients,
        "optimizer": cost.memory.optimizer,
        "kept_gathered": sum(
            u.gathered_numel * config.precision.compute for u in cost.units if not u.reshard_after_forward
        ),
        "saved_activations": cost.memory.activations,
        "all_gathers": sum(n for (op, _, _), n in counts.items() if op == "all_gather"),
        "reduce_scatters": sum(n for (op, _, _), n in counts.items() if op == "reduce_scatter"),
    }


def bytes_per_parameter(precision: Precision) -> dict[str, int]:
    """What every parameter costs between steps (the sharded state before sharding), and the transient
    compute copy a unit all-gathers when param_dtype is narrower than the stored master copy."""
    state = {
        "weights (master copy)": precision.storage,
        "gradients": precision.storage,
        "optimizer state": precision.optimizer_state,
    }
    return {**state, "total kept": sum(state.values()), "gathered compute copy (transient)": precision.compute}


def zero_stages(config: ModelConfig, dp: int) -> dict[str, int]:
    """Per-rank bytes of parameters + gradients + optimizer state over ``dp`` data-parallel ranks.

    ZeRO-0 (DDP) and ZeRO-3 (fully_shard) are the cost model's own layouts (padding included);
    ZeRO-1 shards only the optimizer state, ZeRO-2 the gradients too, from the same bytes per parameter."""
    dims = ParallelDims(world_size=dp, dp_shard=dp)
    ddp = estimate(replace(config, param_shard=False), dims).memory
    fsdp = estimate(config, dims).memory
    p = estimate(config, ParallelDims(world_size=1)).parameter_count
    s, o = config.precision.storage, config.precision.optimizer_state
    return {
        "ZeRO-0 (DDP)": ddp.parameters + ddp.gradients + ddp.optimizer,
        "ZeRO-1 (optimizer sharded)": p * (2 * s) + p * o // dp,
        "ZeRO-2 (+ gradients sharded)": p * s + p * (s + o) // dp,
        "ZeRO-3 (+ parameters sharded: fully_shard)": fsdp.parameters + fsdp.gradients + fsdp.optimizer,
    }


def comparison_rows(measured: dict[str, int], prediction: dict[str, int]) -> list[tuple[str, str, str, str]]:
    """(what, cost model, measured, agreement) for a table: exact parts must be equal, the activation
    estimate shows its ratio."""
    rows = []
    for name in PARTS + ("all_gathers", "reduce_scatters"):
        a, b = prediction[name], measured[name]
        shown = (str(a), str(b)) if name in ("all_gathers", "reduce_scatters") else (fmt_bytes(a), fmt_bytes(b))
        verdict = ("✔ equal" if a == b else "✘ differs") if name in EXACT else f"estimate; measured/model {b / a:.2f}"
        rows.append((name.replace("_", " "), *shown, verdict))
    return rows
