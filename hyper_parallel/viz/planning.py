"""Figures of planning at scale (``python -m launch plan``, notebook 11): the cost model's memory and
communication for one layout, every valid layout of a world size as memory against step time, and a
design review's named candidates with their step-time ranges and the Pareto front."""

from __future__ import annotations

from matplotlib.figure import Figure

from hyper_parallel.cost_model import CostEstimate
from hyper_parallel.cost_model.layouts import GIB, TimedCollective
from hyper_parallel.cost_model.ranking import RankedLayout
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.viz.style import OP_COLORS, OP_SHORT, fmt_bytes, group_hatch, new_figure

MEMORY_PARTS = ("parameters", "gradients", "optimizer", "gathered", "activations")
MEMORY_COLORS = ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974")


def budget_axis_top(total_gib: float, budget_gib: float | None) -> float:
    """The memory bar's axis: room for the legend above the bars and the budget line, unless the budget is
    over twice the bars (13 GiB on an 80 GiB part), where the axis follows the bars so each kind stays
    visible and the budget is named in words."""
    if budget_gib and total_gib and budget_gib > 2 * total_gib:
        return total_gib * 1.7
    return max(total_gib, budget_gib or 0) * 1.7 or 1.0


def plan_figure(cost: CostEstimate, timed: list[TimedCollective], memory_gib: float | None = 80.0) -> Figure:
    """Left: per-rank memory stacked by kind (and the budget). Right: the step's communication time per
    (op, group), both phases, hatched by group, with its bytes; bars of groups that cross nodes are outlined red."""
    fig = new_figure(11.5, 4.2)
    grid = fig.add_gridspec(1, 2, width_ratios=[1, 3])
    ax = fig.add_subplot(grid[0, 0])
    ax.set_label("memory")
    bottom = 0.0
    for part, color in zip(MEMORY_PARTS, MEMORY_COLORS):
        value = getattr(cost.memory, part) / GIB
        ax.bar(0, value, 0.6, bottom=bottom, color=color, label=f"{part} {fmt_bytes(value * GIB)}", gid=part)
        bottom += value
    top = budget_axis_top(bottom, memory_gib)
    if memory_gib and memory_gib <= top:
        ax.axhline(memory_gib, color="#cf222e", linestyle="--", linewidth=1)
        ax.text(0.32, memory_gib, f"{memory_gib:g} GiB", color="#cf222e", fontsize=8, va="bottom")
    elif memory_gib:  # far above the bars: on the axis it would flatten them
        ax.text(0.32, top, f"budget {memory_gib:g} GiB\n(above the axis)", color="#cf222e", fontsize=8, va="top")
    ax.set_xticks([])
    ax.set_ylabel("GiB per rank")
    ax.set_ylim(0, top)
    ax.set_title(f"memory per rank: {fmt_bytes(cost.memory.total)}", fontsize=10)
    ax.legend(fontsize=7.5, loc="upper left")
    cax = fig.add_subplot(grid[0, 1])
    cax.set_label("communication")
    per_key: dict[tuple[str, str], list] = {}
    for c in timed:
        entry = per_key.setdefault((c.op, c.group), [0.0, 0.0, c.crosses_nodes])
        entry[0] += c.seconds * 1e3
        entry[1] += c.bytes
    for i, ((op, group), (ms, nbytes, crosses)) in enumerate(per_key.items()):
        cax.bar(
            i,
            ms,
            0.7,
            color=OP_COLORS.get(op, "grey"),
            hatch=group_hatch(group),
            edgecolor="#cf222e" if crosses else "black",
            linewidth=2 if crosses else 0.8,
            gid="comm",
        )
        cax.text(i, ms, fmt_bytes(nbytes), ha="center", va="bottom", fontsize=7.5)
    cax.set_xticks(range(len(per_key)))
    cax.set_xticklabels([f"{OP_SHORT.get(op, op)}\n{group}" for op, group in per_key], fontsize=8)
    cax.set_ylabel("ms per step (model)")
    total = sum(ms for ms, _, _ in per_key.values())
    cax.set_title(f"communication per step: {total:.1f} ms (red outline: the group spans nodes)", fontsize=10)
    fig.suptitle(
        f"{cost.config.name} on {cost.dims.world_size} ranks: {cost.dims.label()}",
        fontsize=11,
    )
    return fig


def compare_figure(ranked: list[RankedLayout], highlight: ParallelDims | None = None) -> Figure:
    """Every ranked layout as a point: per-rank memory against the step time (``cost_model.step_time``)."""
    fig = new_figure(7.5, 4.2)
    ax = fig.add_subplot()
    ax.set_label("compare")
    for fits, color in ((True, "#1f77b4"), (False, "#bbbbbb")):
        points = [r for r in ranked if r.fits == fits]
        ax.scatter(
            [r.step_seconds * 1e3 for r in points],
            [r.memory_bytes / GIB for r in points],
            s=14,
            color=color,
            label="within the memory budget" if fits else "over the budget",
            gid=f"fits={fits}",
        )
    if ranked:
        best = ranked[0]
        ax.scatter(
            [best.step_seconds * 1e3],
            [best.memory_bytes / GIB],
            s=90,
            facecolors="none",
            edgecolors="green",
            linewidths=2,
            label="best: " + best.dims.label(),
        )
    mine = next((r for r in ranked if r.dims == highlight), None)
    if mine is not None:
        ax.scatter(
            [mine.step_seconds * 1e3],
            [mine.memory_bytes / GIB],
            marker="*",
            s=160,
            color="#cf222e",
            label="this plan: " + mine.dims.label(),
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("step time, ms (model: compute, overlap, critical communication)")
    ax.set_ylabel("memory per rank, GiB")
    ax.set_title(f"{len(ranked)} valid layouts of {ranked[0].dims.world_size if ranked else '?'} ranks", fontsize=10)
    ax.legend(fontsize=7.5)
    return fig


def _label_places(reviews: list, budget_bytes: float | None) -> dict[int, tuple[float, int]]:
    """Where each label goes: (x in data, y offset in points above its point). A candidate close to one
    already labelled (within 12 % of the x axis and 8 % of the y axis the figure draws) joins its group:
    the group's labels stack one line apart, left-aligned just right of the group's rightmost point, so the
    thin lines that join labels to points cross neither the other labels nor the points. Groups at one height
    stack too, the rightmost lowest: a label runs right, over the points of the groups to its right, so it
    sits above their labels and their lines rise below it."""
    if not reviews:
        return {}
    x_low = min(r.step.fast.total for r in reviews) * 0.85
    x_span = max(r.step.slow.total for r in reviews) * 1.25 - x_low or 1.0
    y_span = max([r.cost.memory.total for r in reviews] + [budget_bytes or 0]) * 1.2 or 1.0
    groups: list[list] = []
    for review in sorted(reviews, key=lambda r: (r.step.seconds, r.cost.memory.total)):
        x, y = review.step.seconds, review.cost.memory.total
        group = next(
            (
                g
                for g in groups
                if any(
                    abs(o.step.seconds - x) < 0.12 * x_span and abs(o.cost.memory.total - y) < 0.08 * y_span for o in g
                )
            ),
            None,
        )
        if group is None:
            groups.append([review])
        else:
            group.append(review)
    places = {}
    placed: list[tuple[list, int]] = []  # (group, its first line), right to left
    for group in sorted(groups, key=lambda g: -max(r.step.seconds for r in g)):
        left = max(r.step.seconds for r in group) + 0.03 * x_span
        first = max((line + len(g) for g, line in placed if _same_height(g, group, y_span)), default=0)
        for height, review in enumerate(group, start=first):
            places[id(review)] = (left, 16 + 12 * height)
        placed.append((group, first))
    return places


def _same_height(one: list, other: list, y_span: float) -> bool:
    """Whether two groups' points sit within 8 % of the y axis of each other: their labels share lines."""
    return any(abs(a.cost.memory.total - b.cost.memory.total) < 0.08 * y_span for a in one for b in other)


def review_figure(reviews: list, budget_bytes: float | None = None) -> Figure:
    """Named candidates (``cost_model.review.review_layouts``) as points: the step time's middle with its
    range as a bar, against per-rank memory; every point labelled with its layout and rank ("2=" for a
    tie), the Pareto front within the budget joined by a line, the budget dashed."""
    fig = new_figure(7.5, 4.4)
    ax = fig.add_subplot()
    ax.set_label("review")
    places = _label_places(reviews, budget_bytes)
    for review in reviews:
        _draw_candidate(ax, review, places[id(review)])
    _draw_front_and_budget(ax, reviews, budget_bytes)
    _review_axes(ax, reviews, budget_bytes)
    return fig


def _draw_candidate(ax, review, place: tuple[float, float]) -> None:
    """One candidate: its step time's middle and range against its memory, labelled at ``place`` (offset
    points) with its rank and layout; grey when it does not fit."""
    step, memory = review.step, review.cost.memory.total / GIB
    color = "#1f77b4" if review.fits else "#999999"
    ax.errorbar(
        [step.seconds],
        [memory],
        xerr=[[step.seconds - step.fast.total], [step.slow.total - step.seconds]],
        fmt="o",
        color=color,
        ecolor=color,
        capsize=3,
        markersize=7,
        gid=f"candidate:{review.label}",
    )
    over = "" if review.fits else " (over budget)"
    ax.annotate(
        f"#{review.rank_text} {review.label}{over}",
        (step.seconds, memory),
        textcoords=("data", "offset points"),
        xytext=place,
        fontsize=8,
        color="black" if review.fits else "#777777",
        arrowprops={
            "arrowstyle": "-",
            "linewidth": 0.6,
            "color": "#777777",
            "relpos": (0, 0),
            "shrinkA": 0,
            "shrinkB": 4,
        },
    )


def _draw_front_and_budget(ax, reviews: list, budget_bytes: float | None) -> None:
    """The Pareto front within the budget as a green line, and the budget as a dashed red one."""
    front = sorted((r for r in reviews if r.pareto), key=lambda r: r.step.seconds)
    if front:
        ax.plot(
            [r.step.seconds for r in front],
            [r.cost.memory.total / GIB for r in front],
            color="green",
            linewidth=1.2,
            linestyle="-",
            marker="s",
            markerfacecolor="none",
            markersize=11,
            label="Pareto front (within budget)",
            gid="pareto",
        )
    if budget_bytes:
        ax.axhline(
            budget_bytes / GIB,
            color="#cf222e",
            linestyle="--",
            linewidth=1,
            label=f"memory budget {budget_bytes / GIB:.1f} GiB",
        )


def _review_axes(ax, reviews: list, budget_bytes: float | None) -> None:
    """Limits with room for the labels on the right and the budget on top, axis labels, title, legend."""
    times = [r.step.slow.total for r in reviews] + [r.step.fast.total for r in reviews]
    if times:
        ax.set_xlim(min(times) * 0.85, max(times) * 1.25)  # room for the labels on the right
    ax.set_ylim(0, max([r.cost.memory.total / GIB for r in reviews] + [(budget_bytes or 0) / GIB]) * 1.2 or 1)
    ax.set_xlabel("step time, s (model: bar = the step's range, compute -+20 %)")
    ax.set_ylabel("memory per rank, GiB")
    ax.set_title("candidates: step time against memory (lower left is better)", fontsize=10)
    ax.legend(fontsize=7.5, loc="upper right")  # the labels sit by the points, low on the axis
