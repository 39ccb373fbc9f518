"""Concepts before mechanics: what a parallel style splits, where its collectives go, an idealized step.

The notebooks show these before any measured figure, so a learner who knows DDP sees the idea first
and then recognises it in the traces of a real run:

    concept_figure("fsdp")              left: which ranks hold which block of the tensors the style
                                        splits; right: one layer's compute and collectives, forward
                                        and backward, in order
    ideal_schedule(2, shard=True)       the slots of one idealized training step (one rank, nothing
                                        overlaps, every collective instantaneous in its place)
    ideal_timeline(schedule)            that schedule drawn as a timeline, compute on one lane and
                                        collectives on the other
    cp_chunks(cp)                       which sequence chunks every cp rank holds (i and 2cp-1-i)

Torch-free (matplotlib only). The schedule itself (``ideal_schedule``, ``cp_chunks``, ``Slot``) is data
and lives in ``hyper_parallel.viz.ideal_step``; it counts the same collectives as the cost model
(``hyper_parallel.cost_model``) for the recipes' models: tests/test_concepts.py holds them equal.
"""

from __future__ import annotations

from collections import Counter

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from hyper_parallel.viz.ideal_step import Slot, cp_chunks, ideal_schedule
from hyper_parallel.viz.style import OP_COLORS, OP_SHORT, PHASE_COLORS, new_figure, rank_color

STYLES = ("ddp", "fsdp", "hsdp", "tp", "sp", "cp", "moe")
COMPUTE_COLOR = "#9e9e9e"
COPY_COLOR = "#f2f2f2"  # a cell held whole by several ranks (one strip of each one's colour on it)


def _slot_label(slot: Slot) -> str:
    return slot.what if slot.op is None else f"{OP_SHORT.get(slot.op, slot.op)} {slot.group}"


def _bar_label(slot: Slot) -> str:
    """The text inside a slot's bar (vertical): a flattened group goes on two lines ("AR dp_replicate" over
    "+fsdp"), so it fits the bar's height (one line was clipped to "AR dp_replicate+fsd")."""
    if slot.op is None:
        return slot.what.split(" (")[0]
    return _slot_label(slot).replace("+", "\n+", 1)


def ideal_timeline(schedule: list[Slot], title: str = "An idealized step") -> Figure:
    """The schedule as a timeline of one rank: compute boxes (grey, 1 unit wide) on the upper lane,
    collectives (coloured by op, 0.6 wide) on the lower one, forward and backward shaded. Nothing
    overlaps and nothing waits: compare it with the measured timeline, where ranks wait for each other.
    Bars carry ``gid="ideal:<op or compute>"``."""
    if not schedule:
        raise ValueError("the schedule is empty")
    widths = [1.0 if s.op is None else 0.6 for s in schedule]
    fig = new_figure(max(8.0, 0.42 * sum(widths) + 2), 3.3)
    ax = fig.add_subplot()
    ax.set_label("ideal_timeline")
    x, spans = 0.0, {}
    for slot, width in zip(schedule, widths):
        lane = 1 if slot.op is None else 0
        ax.add_patch(
            Rectangle(
                (x, lane + 0.1),
                width * 0.94,
                0.8,
                facecolor=OP_COLORS.get(slot.op, COMPUTE_COLOR),
                edgecolor="black",
                linewidth=0.6,
                gid=f"ideal:{slot.op or 'compute'}",
            )
        )
        ax.text(
            x + width * 0.47,
            lane + 0.5,
            _bar_label(slot),
            ha="center",
            va="center",
            rotation=90,
            fontsize=6.5,
            color="white" if slot.op else "black",
        )
        lo, hi = spans.get(slot.phase, (x, x))
        spans[slot.phase] = (min(lo, x), max(hi, x + width))
        x += width
    for phase, (lo, hi) in spans.items():
        ax.axvspan(lo, hi, color=PHASE_COLORS.get(phase, "#f2f2f2"), zorder=-1)
        ax.text((lo + hi) / 2, 2.05, phase, ha="center", va="bottom", fontsize=9)
    ax.set_xlim(0, x)
    ax.set_ylim(0, 2.4)
    ax.set_yticks([0.5, 1.5], ["collectives", "compute"])
    ax.set_xticks([])
    counts = Counter(OP_SHORT.get(s.op, s.op) for s in schedule if s.op)
    ax.set_title(
        f"{title}: "
        + ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
        + " per step (one rank; no waiting, no overlap)",
        fontsize=9.5,
    )
    return fig


# ---------------------------------------------------------------- the left panel: what is split


def _tensor(ax, x0, y0, rows, cols, owner, name, world, cell=0.5, dy=None):
    """A tensor as a rows x cols grid; ``owner(r, c)``: a rank, a tuple of ranks (copies) or None (not computed)."""
    for r in range(rows):
        for c in range(cols):
            who = owner(r, c)
            x, y = x0 + c * cell, y0 + r * cell
            if who is None:
                ax.add_patch(Rectangle((x, y), cell, cell, facecolor="white", edgecolor="#cccccc", hatch="//"))
            elif isinstance(who, tuple):
                ax.add_patch(Rectangle((x, y), cell, cell, facecolor=COPY_COLOR, edgecolor="black", linewidth=0.5))
                for i, rank in enumerate(who):
                    w = cell / len(who)
                    ax.add_patch(
                        Rectangle(
                            (x + i * w, y + cell * 0.35),
                            w,
                            cell * 0.3,
                            facecolor=rank_color(rank, world),
                            edgecolor="none",
                            gid=f"owner{rank}",
                        )
                    )
            else:
                ax.add_patch(
                    Rectangle(
                        (x, y),
                        cell,
                        cell,
                        facecolor=rank_color(who, world),
                        edgecolor="black",
                        linewidth=0.5,
                        gid=f"owner{who}",
                    )
                )
    ax.text(
        x0 + cols * cell / 2, y0 + rows * cell + 0.12, "\n".join(_wrap(name, 20)), ha="center", va="top", fontsize=7.5
    )


def _draw_split(ax, style: str) -> str:
    """Draw what ``style`` splits over 2 ranks (4 for HSDP); returns the caption."""
    both = (0, 1)
    if style == "ddp":
        _tensor(ax, 0, 0.6, 4, 4, lambda r, c: both, "W: a whole copy on rank 0 and rank 1", 2)
        _tensor(ax, 3, 0.6, 4, 2, lambda r, c: r // 2, "batch: rows split", 2)
        return "every rank holds every parameter; each trains on its own rows"
    if style == "fsdp":
        _tensor(ax, 0, 0.6, 4, 4, lambda r, c: r // 2, "W stored: a shard per rank", 2)
        _tensor(ax, 3, 0.6, 4, 4, lambda r, c: both, "W while its unit computes", 2)
        return "a shard per rank between uses; the whole tensor only while its unit computes"
    if style == "hsdp":
        _tensor(ax, 0, 0.6, 4, 4, lambda r, c: (r // 2, 2 + r // 2), "W: shard r on ranks r and r+2", 4)
        return "shard over fsdp ({0,1}, {2,3}); copies of each shard across dp_replicate ({0,2}, {1,3})"
    if style == "tp":
        _tensor(ax, 0, 0.6, 4, 4, lambda r, c: r // 2, "wq/wk/wv/w1 colwise: S(0)", 2)
        _tensor(ax, 2.6, 0.6, 4, 4, lambda r, c: c // 2, "wo/w2 rowwise: S(1)", 2)
        return (
            "colwise layers split output features, rowwise ones input features: partial sums, all-reduced; "
            "in backward one all-reduce per block input"
        )
    if style == "sp":
        _tensor(ax, 0, 0.6, 4, 2, lambda r, c: r // 2, "between blocks: sequence split", 2)
        _tensor(ax, 1.8, 0.6, 4, 2, lambda r, c: both, "inside a block: whole sequence", 2)
        return "rows = tokens: norms and residuals on a sequence shard; AG into a block, RS out of it"
    if style == "cp":
        owner = {chunk: rank for rank, chunks in cp_chunks(2).items() for chunk in chunks}
        _tensor(
            ax, 0, 0.6, 4, 4, lambda q, k: owner[q] if k <= q else None, "causal mask: query chunk (row) x key chunk", 2
        )
        return "rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2: 5 mask blocks each (hatched: masked)"
    if style == "moe":
        _tensor(ax, 0, 0.6, 4, 1, lambda r, c: r // 2, "experts E0-E3: S(0) over ep", 2)
        _tensor(ax, 1.3, 0.6, 4, 3, lambda r, c: r // 2, "tokens: where they start", 2)
        return "each token goes to the rank of its top-k experts (dispatch) and comes back (combine)"
    raise ValueError(f"unknown style {style!r}; choose one of {STYLES}")


_ONE_LAYER = {
    "ddp": dict(model="mlp", shard=False, replicate=True),
    "fsdp": dict(model="mlp"),
    "hsdp": dict(model="mlp", replicate=True),
    "tp": dict(tp=True, shard=False),
    "sp": dict(tp=True, sp=True, shard=False),
    "cp": dict(cp=True),
    "moe": dict(moe_layers=(0,), expert_shard=False, shard=False),
}


def concept_figure(style: str) -> Figure:
    """What ``style`` splits (left) and where its collectives sit in one layer's forward and backward
    (right, from ``ideal_schedule``). Axes labelled ``"concept:split"`` and ``"concept:flow"``."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; choose one of {STYLES}")
    schedule = ideal_schedule(1, root=False, **_ONE_LAYER[style])
    width = max(3, *(sum(s.phase == p for s in schedule) for p in ("forward", "backward")))
    # the flow panel as wide as its boxes (a fixed 5 left half of FSDP's canvas empty)
    fig = new_figure(4.6 + 0.95 * (width + 1.2), 3.6)
    grid = fig.add_gridspec(1, 2, width_ratios=[4.6, 0.95 * (width + 1.2)])
    left = fig.add_subplot(grid[0, 0])
    left.set_label("concept:split")
    _split_panel(fig, left, style)
    right = fig.add_subplot(grid[0, 1])
    right.set_label("concept:flow")
    _flow_panel(right, schedule, width)
    fig.suptitle(f"{style.upper()}: what is split, and where the collectives go", fontsize=11)
    return fig


def _split_panel(fig: Figure, left, style: str) -> None:
    """What ``style`` splits, each rank's part in its colour, the cell encodings' legend below the figure."""
    caption = _draw_split(left, style)
    world = 4 if style == "hsdp" else 2
    handles = _split_legend(left, world)
    fig.legend(handles=handles, loc="outside lower left", ncol=len(handles), fontsize=7.5, frameon=False)
    left.set_xlim(-0.2, 5.2)
    left.set_ylim(3.4, 0.3)
    left.set_aspect("equal")
    left.axis("off")
    left.set_title("\n".join(_wrap(caption, 48)), fontsize=8.5)


def _flow_panel(right, schedule: list[Slot], width: int) -> None:
    """One layer's forward and backward in order: compute in grey, each collective in its op's colour with its
    group and what it carries; the title names only the collectives drawn."""
    for row, phase in enumerate(("forward", "backward")):
        slots = [s for s in schedule if s.phase == phase]
        for i, slot in enumerate(slots):
            right.add_patch(
                Rectangle(
                    (i, row + 0.15),
                    0.9,
                    0.7,
                    facecolor=OP_COLORS.get(slot.op, "#e0e0e0"),
                    edgecolor="black",
                    linewidth=0.6,
                    gid=f"flow:{slot.op or 'compute'}",
                )
            )
            text = slot.what if slot.op is None else f"{OP_SHORT.get(slot.op, slot.op)} {slot.group}\n{slot.what}"
            right.text(
                i + 0.45,
                row + 0.5,
                "\n".join(_wrap(text, 13)),
                ha="center",
                va="center",
                fontsize=6.6,
                color="white" if slot.op else "black",
            )
            if i + 1 < len(slots):
                right.annotate(
                    "", xy=(i + 1, row + 0.5), xytext=(i + 0.9, row + 0.5), arrowprops={"arrowstyle": "-|>", "lw": 0.8}
                )
        right.text(-0.1, row + 0.5, phase, ha="right", va="center", fontsize=9, fontweight="bold")
    right.set_xlim(-1.2, width)
    right.set_ylim(2, 0)
    right.axis("off")
    ops = [op for op in OP_SHORT if any(s.op == op for s in schedule)]  # only the names this figure uses
    names = ", ".join(f"{OP_SHORT[op]} {op.replace('_', '-')}" for op in ops)
    right.set_title("\n".join(_wrap(f"one layer, in order. grey: compute; {names}", 60)), fontsize=8.5)


def _split_legend(ax, world: int) -> list[Patch]:
    """The ranks' colours, and the two other cell encodings where the panel draws them: a copy on several
    ranks (a grey cell with one strip per rank holding it) and a masked cell (hatched)."""
    handles = [Patch(facecolor=rank_color(r, world), edgecolor="black", label=f"rank {r}") for r in range(world)]
    if any(patch.get_facecolor()[:3] == to_rgb(COPY_COLOR) for patch in ax.patches):
        handles.append(Patch(facecolor=COPY_COLOR, edgecolor="black", label="a copy on each rank striped in it"))
    if any(patch.get_hatch() == "//" for patch in ax.patches):
        handles.append(Patch(facecolor="white", edgecolor="#cccccc", hatch="//", label="not computed (masked)"))
    return handles


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + ([line] if line else [])
