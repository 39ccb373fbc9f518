"""Per-rank timeline of one training step: a bar per collective, coloured by op, hatched by group."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from hyper_parallel.link import Link
from hyper_parallel.viz.clocks import clock_offsets, shift_clocks
from hyper_parallel.viz.overlap import chunk_overlap, exposure, has_compute
from hyper_parallel.viz.style import (
    OP_COLORS,
    OP_SHORT,
    OPS,
    PHASE_COLORS,
    group_hatch,
    new_figure,
    title,
)

Traces = dict[int, list[dict[str, Any]]]
MIN_BAR = 0.006
"""Bars shorter than this fraction of the step are drawn this wide (and outlined) so they stay visible."""
COMPUTE_COLOR = "#4d4d4d"
IN_FLIGHT_ALPHA = 0.35
"""An asynchronous collective is drawn pale from its issue to its wait (in flight while compute runs) and
solid from the wait to its end (the training thread blocked on it)."""


def steps_of(traces: Traces) -> list[int]:
    """Steps that have collectives outside the init phase."""
    return sorted(
        {
            e["step"]
            for events in traces.values()
            for e in events
            if e.get("kind") == "collective" and e["phase"] != "init"
        }
    )


def collectives(
    traces: Traces, step: int | None = None, rank: int | None = None, include_init: bool = False
) -> list[tuple[int, dict]]:
    """(rank, event) of every collective of ``step`` (all steps: None), init-phase ones excluded by default."""
    return [
        (r, e)
        for r, events in sorted(traces.items())
        if rank is None or r == rank
        for e in events
        if e.get("kind") == "collective"
        and (step is None or e["step"] == step)
        and (include_init or e["phase"] != "init")
    ]


def _times(event: dict) -> tuple[float, float]:
    return (event["t_start"], event["t_end"]) if "t_start" in event else (event["t"], event["t"])


def phase_spans(events: list[dict]) -> list[tuple[str, float, float]]:
    """(phase, start, end) in time order: a phase runs from its first event to the next phase's first
    event; the last one ends with its last event."""
    firsts, last = {}, None
    for event in sorted(events, key=lambda e: _times(e)[0]):
        start, end = _times(event)
        firsts.setdefault(event["phase"], start)
        last = end if last is None else max(last, end)
    ordered = sorted(firsts.items(), key=lambda item: item[1])
    return [
        (phase, start, ordered[i + 1][1] if i + 1 < len(ordered) else last) for i, (phase, start) in enumerate(ordered)
    ]


@dataclass(frozen=True)
class _Lanes:
    """What one timeline draws: the step, its rows (a rank, or a rank and a group), its events and time axis."""

    step: int
    ranks: list[int]
    all_ranks: list[int]
    chosen: list[tuple[int, dict]]  # (rank, collective) of the step on the drawn ranks
    groups: list[str]
    by_group: bool
    lanes: list[tuple[int, str | None]]
    step_events: dict[int, list[dict]]  # every event of the step on each drawn rank
    t0: float
    span: float  # seconds

    def ms(self, t: float) -> float:
        return (t - self.t0) * 1e3

    def rows_of(self, rank: int) -> list[int]:
        return [i for i, lane in enumerate(self.lanes) if lane[0] == rank]

    def row(self, rank: int, group: str) -> int:
        return self.lanes.index((rank, group if self.by_group else None))


def _lanes(traces: Traces, step: int | None, by_group: bool | None, ranks) -> _Lanes:
    steps = steps_of(traces)
    if not steps:
        raise ValueError("the traces hold no collectives")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ValueError(f"no collectives in step {step}; steps with collectives: {steps}")
    all_ranks = sorted(traces)
    ranks = _chosen_ranks(all_ranks, ranks)
    chosen = [(r, e) for r, e in collectives(traces, step) if r in ranks]
    groups = sorted({e["group"] for _, e in chosen}, key=lambda g: (g not in ("fsdp", "efsdp"), g))
    if by_group is None:
        by_group = len(groups) > 1 and len(ranks) * len(groups) <= 32
    lanes = [(r, g) for r in ranks for g in groups] if by_group else [(r, None) for r in ranks]
    step_events = {r: [e for e in traces[r] if e["step"] == step and e["phase"] != "init"] for r in ranks}
    t0 = min(_times(e)[0] for events in step_events.values() for e in events)
    t1 = max(_times(e)[1] for events in step_events.values() for e in events)
    return _Lanes(step, ranks, all_ranks, chosen, groups, by_group, lanes, step_events, t0, max(t1 - t0, 1e-9))


def timeline(
    traces: Traces,
    step: int | None = None,
    by_group: bool | None = None,
    recipe: str | None = None,
    degrees=None,
    label_modules: bool = True,
    align: bool = True,
    ranks: str | list[int] | tuple[int, ...] | None = None,
    time_span: float | None = None,
    link: Link | None = None,
) -> Figure:
    """The collectives of one step (default: the last) against time, for rank 0 and one peer by default.

    ``time_span``: seconds the time axis covers when longer than the step (two timelines on one scale,
    ``step_span``); the unit labels are spaced for that axis.

    ``ranks``: which ranks get rows (None: ``default_ranks``, rank 0 and the next rank; ``"all"``: every
    rank). On a 2-core machine extra rows mostly show ranks waiting for a core, not the lesson; the
    clocks are still aligned with every rank's trace. One row per rank (``by_group=True``: one row per
    rank and group; None: split when there are several groups and at most 32 rows). A bar spans t_start..t_end (ms from the step's first event,
    at least ``MIN_BAR`` of the step wide), its colour is the op, its hatch the group; the background
    of each row is shaded by phase (forward / backward / optimizer). Collective bars have
    ``gid="collective"``; ``label_modules`` writes the fully_shard unit over rank 0's bars.
    ``align`` corrects the ranks' clock offsets first (``clock_offsets``). ``link``: the emulated link the run
    waited on (``hyper_parallel.link``), named in the title as an emulation.

    The figure carries a one-line title and the legend below the axes; what is too long for a title
    (rank 0's counts, how the clocks were aligned, which bars are widened) is in ``fig.notes``, a list
    of sentences a notebook prints in its Markdown or output where it wants them (``timeline_notes``).
    """
    offsets = clock_offsets(traces) if align else {}
    if align:
        traces = shift_clocks(traces, offsets)
    lanes = _lanes(traces, step, by_group, ranks)
    if time_span is not None and time_span > lanes.span:
        lanes = replace(lanes, span=time_span)
    computing = has_compute(traces)
    fig = new_figure(13, 2.6 + 0.3 * len(lanes.lanes) + (0.3 if lanes.by_group else 0))
    ax = fig.add_subplot()
    ax.set_label("timeline")
    _shade_phases(ax, lanes)
    if computing:
        _draw_compute(ax, lanes)
    bar_height = 0.58 if computing else 0.76
    for rank, event in lanes.chosen:
        _draw_collective(ax, lanes, lanes.row(rank, event["group"]), event, bar_height)
    if label_modules:
        _label_units(ax, [e for r, e in lanes.chosen if r == lanes.ranks[0]], lanes.ms, lanes.span)
    _axes(ax, lanes)
    ops = [op for op in OPS if any(e["op"] == op for _, e in lanes.chosen)]
    _legend(fig, lanes, ops, computing)
    _title_and_notes(fig, traces, lanes, ops, offsets if align else None, computing, recipe, degrees, link)
    return fig


def _shade_phases(ax, lanes: _Lanes) -> None:
    """Each rank's rows shaded by phase, the phase named over the first rank."""
    for r in lanes.ranks:
        rows = lanes.rows_of(r)
        for phase, start, end in phase_spans(lanes.step_events[r]):
            ax.add_patch(
                Rectangle(
                    (lanes.ms(start), min(rows) - 0.5),
                    lanes.ms(end) - lanes.ms(start),
                    len(rows),
                    facecolor=PHASE_COLORS.get(phase, "#f2f2f2"),
                    edgecolor="none",
                    zorder=0,
                    gid="phase",
                )
            )
            if r == lanes.ranks[0]:
                ax.text(
                    (lanes.ms(start) + lanes.ms(end)) / 2,
                    -1.25,
                    phase,
                    ha="center",
                    va="bottom",
                    fontsize=9,
                    color="#555555",
                    fontstyle="italic",
                )


def _draw_compute(ax, lanes: _Lanes) -> None:
    """A thin strip under each row for every compute span of its rank."""
    for r in lanes.ranks:
        for event in lanes.step_events[r]:
            if event.get("kind") != "compute":
                continue
            for row in lanes.rows_of(r):
                ax.add_patch(
                    Rectangle(
                        (lanes.ms(event["t_start"]), row + 0.24),
                        lanes.ms(event["t_end"]) - lanes.ms(event["t_start"]),
                        0.16,
                        facecolor=COMPUTE_COLOR,
                        edgecolor="none",
                        zorder=2,
                        gid="compute",
                    )
                )


def _draw_collective(ax, lanes: _Lanes, row: int, event: dict, bar_height: float) -> None:
    """One collective's bar (pale while in flight before its wait), widened when tiny, labelled when wide."""
    least = MIN_BAR * lanes.span * 1e3
    start, width = lanes.ms(event["t_start"]), lanes.ms(event["t_end"]) - lanes.ms(event["t_start"])
    tiny = width < least
    width = max(width, least)
    color = OP_COLORS.get(event["op"], "grey")
    top, height = _bar_band(event["op"], row, bar_height)
    if event.get("asynchronous") and event["t_wait"] > event["t_start"]:
        in_flight = min(lanes.ms(event["t_wait"]) - start, width)
        ax.add_patch(
            Rectangle(
                (start, top),
                in_flight,
                height,
                facecolor=color,
                alpha=IN_FLIGHT_ALPHA,
                edgecolor="none",
                zorder=2,
                gid="in_flight",
            )
        )
        start, width = start + in_flight, max(width - in_flight, least)
    ax.add_patch(
        Rectangle(
            (start, top),
            width,
            height,
            facecolor=color,
            hatch=group_hatch(event["group"]),
            edgecolor="black" if tiny else "#333333",
            linewidth=0.8 if tiny else 0.4,
            zorder=2,
            gid="collective",
        )
    )
    if width > 0.045 * lanes.span * 1e3:
        ax.text(
            start + width / 2,
            top + height / 2,
            f"{OP_SHORT.get(event['op'], event['op'])} {event['group']}",
            ha="center",
            va="center",
            fontsize=7,
            zorder=3,
            clip_on=True,
            bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "alpha": 0.8, "linewidth": 0},
        )


def _axes(ax, lanes: _Lanes) -> None:
    ax.set_xlim(-0.01 * lanes.span * 1e3, lanes.span * 1.01e3)
    ax.set_ylim(len(lanes.lanes) - 0.5, -1.7)
    ax.set_yticks(range(len(lanes.lanes)))
    ax.set_yticklabels([f"rank {r}" + (f" · {g}" if g else "") for r, g in lanes.lanes], fontsize=8)
    for i in range(1, len(lanes.ranks)):
        ax.axhline(i * len(lanes.lanes) / len(lanes.ranks) - 0.5, color="black", linewidth=0.8, zorder=1)
    ax.set_xlabel(f"time in step {lanes.step} (ms since the step's first traced event)")
    ax.grid(axis="x", color="white", linewidth=0.6, zorder=1)


def _legend(fig: Figure, lanes: _Lanes, ops: list[str], computing: bool) -> None:
    handles = [Patch(facecolor=OP_COLORS[op], edgecolor="black", label=op) for op in ops]
    handles += [
        Patch(facecolor="white", edgecolor="black", hatch=group_hatch(g), label=f"group {g}") for g in lanes.groups
    ]
    handles += [
        Patch(facecolor=PHASE_COLORS[p], label=f"{p} phase")
        for p in PHASE_COLORS
        if any(e["phase"] == p for events in lanes.step_events.values() for e in events)
    ]
    if computing:
        handles += [
            Patch(facecolor=COMPUTE_COLOR, label="compute (strip under each row)"),
            Patch(facecolor="#1f77b4", alpha=IN_FLIGHT_ALPHA, label="in flight, not yet waited for"),
        ]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=min(len(handles), 6),
        fontsize=8,
        title="colour = op, hatch = group",
        title_fontsize=8,
    )


def _title_and_notes(
    fig: Figure,
    traces: Traces,
    lanes: _Lanes,
    ops: list[str],
    offsets: dict[int, float] | None,
    computing: bool,
    recipe: str | None,
    degrees,
    link: Link | None = None,
) -> None:
    """The one-line title (with exposed communication when compute was traced) and ``fig.notes``
    (``offsets``: the clock corrections applied, None when the clocks were left raw)."""
    ranks, step, first = lanes.ranks, lanes.step, lanes.ranks[0]
    counts = ", ".join(f"{sum(e['op'] == op for r, e in lanes.chosen if r == first)} {OP_SHORT[op]}" for op in ops)
    exposed = ""
    if computing:
        per_rank = exposure({r: traces[r] for r in ranks}, step)
        exposed = "\nexposed / in-flight communication: " + ", ".join(
            f"r{r} {v['exposed'] * 1e3:.1f}/{v['in_flight'] * 1e3:.1f} ms" for r, v in per_rank.items()
        )
        pipelined = {r: chunk_overlap(traces[r], step) for r in ranks}
        if all(v is not None for v in pipelined.values()):
            exposed += "\nasync TP chunks in flight behind compute: " + ", ".join(
                f"r{r} {v['fraction']:.0%}" for r, v in pipelined.items()
            )
    shown = "" if ranks == lanes.all_ranks else f", ranks {', '.join(map(str, ranks))} of {len(lanes.all_ranks)}"
    fig.suptitle(
        title(f"{'Compute and c' if computing else 'C'}ollectives, step {step}{shown}", recipe, degrees)
        + ("" if link is None else f" · {link.describe()}")
        + exposed,
        fontsize=10,
    )
    if offsets is not None:
        shift = max((abs(v) for v in offsets.values()), default=0.0) * 1e3
        clocks = (
            f"Clocks aligned on the ends of synchronous collectives (largest correction {shift:.1f} ms): a "
            "collective ends together on its ranks and starts when each rank arrives."
        )
    else:
        clocks = "Raw clocks (not aligned)."
    fig.notes = [
        f"rank {first} in step {step}: {counts}.",
        clocks,
        f"Bars under {MIN_BAR:.1%} of the step are widened and outlined so they stay visible.",
    ]
    if ranks != lanes.all_ranks:
        fig.notes.append(
            f'Drawn: ranks {", ".join(map(str, ranks))} of {len(lanes.all_ranks)}; `ranks="all"` draws every rank '
            "(on 2 cores the other rows mostly show ranks waiting for a core)."
        )


def _bar_band(op: str, row: int, bar_height: float) -> tuple[float, float]:
    """(top, height) of a bar in its row: a send in the upper half and a receive in the lower half (a ring
    posts them together, so they would hide each other), any other op the whole bar height."""
    top = row - 0.38
    if op == "send":
        return top, bar_height / 2
    if op == "recv":
        return top + bar_height / 2, bar_height / 2
    return top, bar_height


def default_ranks(all_ranks: list[int]) -> list[int]:
    """Rank 0 and one peer (the next rank): enough to see a collective start when each rank arrives."""
    return all_ranks[:2]


def _chosen_ranks(all_ranks: list[int], ranks) -> list[int]:
    if ranks is None:
        return default_ranks(all_ranks)
    if ranks == "all":
        return all_ranks
    if isinstance(ranks, str):
        raise ValueError(f"ranks must be None, 'all' or a list of ranks, got {ranks!r}")
    missing = sorted(set(ranks) - set(all_ranks))
    if missing or not ranks:
        raise ValueError(f"ranks {sorted(ranks)} are not all in the traces (ranks there: {all_ranks})")
    return sorted(set(ranks))


def step_span(traces: Traces, step: int | None = None, ranks=None) -> float:
    """Seconds from the first to the last event of the step on the ranks a timeline draws."""
    return _lanes(traces, step, None, ranks).span


def timeline_notes(fig: Figure) -> str:
    """The timeline's notes (``fig.notes``) as Markdown bullets, for the cell that shows the figure."""
    return "\n".join(f"* {note}" for note in getattr(fig, "notes", []))


def _label_units(ax, events, ms, span) -> None:
    """Write the fully_shard unit over each of rank 0's FSDP collectives, on two staggered lines; a label
    that would touch the one before it on both lines is left out (adjacent labels read as one: "root root"),
    and one that would run past the axis ends there."""
    level_end = [float("-inf"), float("-inf")]
    char = 0.0072 * span * 1e3  # ms per character at 7 pt on the 13-inch figure, with a little room
    right = span * 1.01e3
    for event in sorted(events, key=lambda e: e["t_start"]):
        module = event.get("module") or ""
        if not module or event["group"] in ("tp", "cp", "ep", "etp"):
            continue
        x = min(ms(event["t_start"]), right - len(module) * char)
        level = next((i for i, end in enumerate(level_end) if x > end), None)
        if level is None:
            continue
        ax.text(x, -0.45 - 0.36 * level, module, ha="left", va="bottom", fontsize=7, color="#222222", clip_on=True)
        level_end[level] = x + (len(module) + 2) * char
