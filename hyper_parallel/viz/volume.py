"""Communication volume of one step: measured bytes per (op, group) against fully_shard's minimum."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from hyper_parallel.cost_model.communication import fsdp_collectives, wire_factor
from hyper_parallel.recipes.workload_facts import SequenceScheme
from hyper_parallel.viz.style import (
    OP_COLORS,
    OP_SHORT,
    OPS,
    fmt_bytes,
    group_hatch,
    new_figure,
    round_byte_ticks,
    title,
)
from hyper_parallel.viz.timeline import collectives, steps_of

Key = tuple[str, str]


def theoretical_bytes(units: list[dict[str, Any]]) -> dict[Key, float]:
    """The minimum bytes fully_shard must move in one training step, per (op, group), as the sum of the
    full buffers of its collectives (the same convention as the trace's ``bytes``).

    For every fully_shard unit (``metrics.json`` "units"), with B = its ``model_local_bytes`` (the unit's
    parameters as each rank computes with them, after TP/EP, unpadded) and S = ``shard_size``:
      * S > 1: all-gather of B on the sharded group once in forward, and once more in backward if the
        unit reshards after forward; one reduce-scatter of B on the sharded group;
      * ``dp_size`` > 1 (HSDP, or DDP when S == 1): one all-reduce of B / S on the unsharded group.
    Not modelled: padding (measured buffers are padded to a multiple of S, so it shows as a ratio
    > 1), mixed precision (B is in the parameters' own dtype), the gradient all-reduce of parameters
    partial over a model-parallel dim, and the collectives of TP, CP and EP themselves. The formula is
    the cost model's (``hyper_parallel.cost_model.communication.fsdp_collectives``), given unpadded bytes;
    the full model of a step, padding and TP/CP/EP included, is ``hyper_parallel.cost_model.estimate``.
    """
    result: dict[Key, float] = defaultdict(float)
    for unit in units:
        size = unit["model_local_bytes"]
        for c in fsdp_collectives(
            size,
            size,
            unit["shard_size"],
            unit["dp_size"],
            bool(unit.get("reshard_after_forward")),
            unit["sharded_group"]["name"],
            unit["unsharded_group"]["name"],
        ):
            result[(c.op, c.group)] += c.bytes
    return dict(result)


def measured_bytes(traces, step: int, rank: int = 0) -> tuple[dict[Key, float], dict[Key, int]]:
    """Sum of the traced full-buffer bytes of ``rank``'s collectives in ``step`` per (op, group), and counts."""
    total: dict[Key, float] = defaultdict(float)
    count: dict[Key, int] = defaultdict(int)
    for _, event in collectives(traces, step, rank):
        total[(event["op"], event["group"])] += event["bytes"]
        count[(event["op"], event["group"])] += 1
    return dict(total), dict(count)


def wire_bytes(traces, step: int) -> dict[int, dict[Key, float]]:
    """Per rank: bytes it puts on the wire in ``step`` per (op, group), ``bytes * wire_factor``."""
    result: dict[int, dict[Key, float]] = {}
    for rank in sorted(traces):
        per: dict[Key, float] = defaultdict(float)
        for _, event in collectives(traces, step, rank):
            per[(event["op"], event["group"])] += event["bytes"] * wire_factor(event["op"], len(event["ranks"]))
        result[rank] = dict(per)
    return result


def _byte_axis(ax, top: float) -> None:
    """Ticks at round numbers of B / KiB / MiB instead of round numbers of bytes."""
    round_byte_ticks(ax.yaxis, top)


def _order(keys) -> list[Key]:
    return sorted(keys, key=lambda k: (OPS.index(k[0]) if k[0] in OPS else 99, k[1]))


def comm_volume(traces, metrics: dict[str, Any], step: int | None = None) -> Figure:
    """Left: rank 0's bytes per (op, group) in one step (default: the last), measured next to
    ``theoretical_bytes(metrics["units"])`` with measured/minimum written on each bar; (op, group)s
    that fully_shard does not issue (TP, CP, EP) are measured only. Right: every rank's wire bytes,
    ``wire_factor`` applied, stacked by (op, group). Measured bars have ``gid="measured"``, minimum
    bars ``gid="theory"``.
    """
    steps = steps_of(traces)
    if not steps:
        raise ValueError("the traces hold no collectives")
    step = steps[-1] if step is None else step
    measured, counts = measured_bytes(traces, step, 0)
    theory = theoretical_bytes(metrics.get("units", []))
    keys = _order(theory) + _order(set(measured) - set(theory))
    fig = new_figure(max(11.0, 1.3 * len(keys) + 5.5), 5.4)
    grid = fig.add_gridspec(1, 2, width_ratios=[max(len(keys), 2), max(len(traces), 2) * 0.6 + 1])
    ax = fig.add_subplot(grid[0, 0])
    ax.set_label("volume")
    _against_minimum(ax, keys, measured, counts, theory, step)
    wax = fig.add_subplot(grid[0, 1])
    wax.set_label("wire")
    _wire_per_rank(wax, wire_bytes(traces, step))
    minimum = (
        "\nminimum = per fully_shard unit: AG of its parameters (twice if resharded after forward), "
        "one RS, AR of 1/shard_size (HSDP)"
    )
    fig.suptitle(
        title(f"Communication volume, step {step}", metrics.get("recipe"), metrics.get("degrees"))
        + (minimum if theory else "\nevery bar is the parallel style's own traffic (TP, CP, EP): measured only"),
        fontsize=10,
    )
    return fig


def _against_minimum(
    ax, keys: list[Key], measured: dict[Key, float], counts: dict[Key, int], theory: dict[Key, float], step: int
) -> None:
    """Rank 0's measured bars beside fully_shard's minimum, fully_shard's (op, group)s first."""
    top = max([*measured.values(), *theory.values(), 1.0])
    for i, key in enumerate(keys):
        if key in theory:
            ax.bar(i - 0.2, theory[key], 0.38, color="#c8c8c8", edgecolor="#555555", linestyle="--", gid="theory")
        if key in measured:
            _measured_bar(ax, i + 0.2 if key in theory else i, key, measured[key], counts[key], theory.get(key), top)
        elif key in theory:
            ax.text(
                i - 0.2,
                theory[key] + top * 0.015,
                "expected,\nnot traced",
                ha="center",
                va="bottom",
                fontsize=7.5,
                color="#b00000",
            )
    if theory and len(theory) < len(keys):
        ax.axvline(len(theory) - 0.5, color="#777777", linestyle=":", linewidth=1)
        wide = len(keys) - len(theory) >= 2  # room right of the divider; else centred over one bar's slot
        ax.text(  # inside the plot: one line once ran on into the gap beside it
            len(theory) - 0.45 if wide else len(theory),
            top * 1.25,
            "not fully_shard's\n(TP, CP, EP):\nmeasured only",
            fontsize=7.5,
            ha="left" if wide else "center",
            va="top",
            color="#555555",
        )
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{OP_SHORT.get(op, op)}\non {group}" for op, group in keys], fontsize=8.5)
    ax.set_ylim(0, top * 1.28)
    ax.set_ylabel("bytes (sum of full buffers)")
    _byte_axis(ax, top)
    if theory:
        ax.set_title(f"rank 0, step {step}: measured vs fully_shard's minimum", fontsize=10)
        ax.legend(  # under the axes: the bars' notes and the "measured only" note use the top of the plot
            handles=[
                Patch(facecolor="#c8c8c8", edgecolor="#555555", linestyle="--", label="minimum (model)"),
                Patch(facecolor="white", edgecolor="black", label="measured (colour = op)"),
            ],
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            ncol=2,
        )
    else:
        ax.set_title(f"rank 0, step {step}: measured (no fully_shard collective on this mesh)", fontsize=10)


def _measured_bar(ax, x: float, key: Key, measured: float, count: int, minimum: float | None, top: float) -> None:
    """One measured bar with its ratio to the minimum (or "measured only"), its calls and its bytes."""
    op, group = key
    ax.bar(
        x, measured, 0.38, color=OP_COLORS.get(op, "grey"), edgecolor="black", hatch=group_hatch(group), gid="measured"
    )
    note = f"×{measured / minimum:.2f} of min" if minimum else "measured only"
    ax.text(
        x,
        measured + top * 0.015,
        f"{note}\n{count} call{'s' * (count != 1)}\n{fmt_bytes(measured)}",
        ha="center",
        va="bottom",
        fontsize=7.5,
    )


def _wire_per_rank(ax, wire: dict[int, dict[Key, float]]) -> None:
    """Every rank's bytes on the wire, stacked by (op, group)."""
    ranks = sorted(wire)
    bottoms = [0.0] * len(ranks)
    for key in _order({k for per in wire.values() for k in per}):
        heights = [wire[r].get(key, 0.0) for r in ranks]
        ax.bar(
            ranks,
            heights,
            0.7,
            bottom=bottoms,
            color=OP_COLORS.get(key[0], "grey"),
            edgecolor="black",
            hatch=group_hatch(key[1]),
            label=f"{OP_SHORT.get(key[0], key[0])} on {key[1]}",
            gid="wire",
        )
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(ranks)
    ax.set_xlabel("rank")
    ax.set_ylabel("bytes sent per rank")
    ax.set_ylim(0, max(bottoms + [1.0]) * 1.35)
    _byte_axis(ax, max(bottoms + [1.0]))
    ax.set_title("wire bytes per rank\n(ring: AG/RS ×(n-1)/n, AR ×2(n-1)/n)", fontsize=10)
    ax.legend(fontsize=7.5, ncol=2, loc="upper center")


SCHEME_STYLES = {  # each sequence scheme's colour and marks in sequence_schemes
    SequenceScheme.ALL_GATHER: dict(color=OP_COLORS["all_gather"], linestyle="--", marker="s", markersize=9),
    SequenceScheme.RING: dict(color="#8c564b", marker="o"),
    SequenceScheme.ULYSSES: dict(color=OP_COLORS["all_to_all"], marker="o"),
}


def sequence_traffic(traces, step: int, rank: int = 0) -> dict[str, float]:
    """``rank``'s bytes on the cp group in ``step`` per phase ("forward", "backward"; full buffers, the
    trace convention; a ring's sends, what it receives being its neighbour's sends): the traffic of the
    run's sequence scheme, all layers together."""
    result = {"forward": 0.0, "backward": 0.0}
    for _, event in collectives(traces, step, rank):
        if event["group"] == "cp" and event["phase"] in result and event["op"] != "recv":
            result[event["phase"]] += event["bytes"]
    return result


def _scheme_cost(recipe: str, degrees: dict[str, int]):
    """The cost model's view of a run: (model config, dims, per-layer bytes of its sequence scheme)."""
    from hyper_parallel.cost_model import recipe_model
    from hyper_parallel.cost_model.communication import sequence_bytes_per_layer
    from hyper_parallel.mesh import ParallelDims

    config = recipe_model(recipe)
    dims = ParallelDims(**{k: v for k, v in degrees.items() if k != "pp"})
    return config, dims, sequence_bytes_per_layer(config, dims, config.global_batch // dims.dp)


def sequence_schemes(
    runs: dict[str, tuple[Any, dict[str, Any]]], step: int | None = None, cp_sizes: tuple[int, ...] = (2, 4, 8)
) -> Figure:
    """K/V all-gather vs ring vs Ulysses: bytes per rank per layer of one step.

    ``runs`` maps a label to ``(traces, metrics)`` of runs of recipes that differ in their sequence
    scheme (M5 / M5-R / M5-U on one mesh). Left: rank 0's traced cp bytes per layer in forward and in
    backward (full buffers), with the cost model's number as a black tick on each bar, and the bytes
    the rank sends (cost model: a ring sends each block whole to one peer, the rest (n-1)/n).
    Right: the cost model's bytes sent per rank per layer for the same model and rows per rank as cp
    grows (ranks = cp), for every cp a scheme allows (Ulysses needs n_heads % cp == 0): all-gather
    and ring stay near 4 x (K of the whole sequence), Ulysses falls as 1/cp.
    """
    if not runs:
        raise ValueError("sequence_schemes needs at least one run: {label: (traces, metrics)}")
    fig = new_figure(12.5, 5.0)
    ax, sax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [max(len(runs), 2) + 1, 3]})
    ax.set_label("per_layer")
    sax.set_label("scaling")
    model_config, rows = _per_layer_panel(ax, runs, step)
    _scaling_panel(sax, model_config, rows, cp_sizes)
    first = next(iter(runs.values()))[1]
    fig.suptitle(title("Sequence schemes: bytes per rank per layer", None, first.get("degrees")), fontsize=10)
    return fig


def _per_layer_panel(ax, runs: dict[str, tuple[Any, dict[str, Any]]], step: int | None) -> tuple[Any, int]:
    """Each run's traced bytes per layer (forward, backward) with the cost model's as black ticks, and the bytes
    a rank sends; returns the last run's model and rows per rank, which the scaling panel costs."""
    top, model_config, rows = 1.0, None, None
    for i, (label, (traces, metrics)) in enumerate(runs.items()):
        steps = steps_of(traces)
        if not steps:
            raise ValueError(f"run {label!r}: the traces hold no collectives")
        config, dims, model = _scheme_cost(metrics["recipe"], metrics["degrees"])
        model_config, rows = config, config.global_batch // dims.dp
        measured = sequence_traffic(traces, steps[-1] if step is None else step)
        color = SCHEME_STYLES[config.sequence_scheme]["color"]
        for j, (phase, hatch) in enumerate((("forward", ""), ("backward", "//"))):
            value = measured[phase] / config.n_layers
            x = i + (j - 1) * 0.27
            ax.bar(x, value, 0.25, color=color, edgecolor="black", hatch=hatch, gid="measured")
            ax.plot([x - 0.17, x + 0.17], [model[phase]] * 2, color="black", linewidth=2.2, gid="model")
            ax.text(x, value, fmt_bytes(value), ha="center", va="bottom", fontsize=7.5)
            top = max(top, value, model[phase])
        ax.bar(i + 0.27, model["sent"], 0.25, color="white", edgecolor=color, linewidth=2, gid="sent")
        ax.text(i + 0.27, model["sent"], fmt_bytes(model["sent"]), ha="center", va="bottom", fontsize=7.5)
        top = max(top, model["sent"])
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(
        [
            f"{label}\n{_scheme_cost(m['recipe'], m['degrees'])[0].sequence_scheme.label}"
            for label, (_, m) in runs.items()
        ],
        fontsize=8.5,
    )
    ax.set_ylim(0, top * 1.2)
    _byte_axis(ax, top)
    ax.set_ylabel("bytes per layer, rank 0")
    ax.set_title("traced (bars) vs cost model (black ticks), one layer", fontsize=10)
    ax.legend(
        handles=[
            Patch(facecolor="#cccccc", edgecolor="black", label="forward, full buffers"),
            Patch(facecolor="#cccccc", edgecolor="black", hatch="//", label="backward, full buffers"),
            Patch(facecolor="white", edgecolor="black", linewidth=2, label="sent per rank, both phases"),
        ],
        fontsize=8,
        loc="upper right",
    )
    return model_config, rows


def _scaling_panel(ax, config, rows: int, cp_sizes: tuple[int, ...]) -> None:
    from hyper_parallel.cost_model.communication import sequence_bytes_per_layer
    from hyper_parallel.mesh import ParallelDims

    for scheme in SequenceScheme:
        variant = config.replace(sequence_scheme=scheme, global_batch=rows)
        points = []
        for cp in cp_sizes:
            dims = ParallelDims(world_size=cp, cp=cp)
            try:
                variant.check(dims)
            except ValueError:
                continue
            points.append((cp, sequence_bytes_per_layer(variant, dims, rows)["sent"]))
        if points:
            ax.plot(*zip(*points), label=scheme.label, gid=scheme.value, **SCHEME_STYLES[scheme])
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(cp_sizes))
    ax.set_xticklabels([str(c) for c in cp_sizes])
    ax.set_xlabel("cp")
    ax.set_ylim(bottom=0)
    _byte_axis(ax, max(max(line.get_ydata()) for line in ax.get_lines()))
    ax.set_ylabel("bytes sent per rank per layer")
    ax.set_title(f"cost model, {rows} rows x seq {config.seq_len}, {config.n_heads} heads", fontsize=10)
    ax.legend(fontsize=8, title="all-gather and ring send the same", title_fontsize=8)
