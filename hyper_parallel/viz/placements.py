"""How a parameter's placements change: sharded -> unsharded (FSDP dim only) -> resharded."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.viz.layout import changes, local_shape, ownership, parse_placements
from hyper_parallel.viz.style import new_figure, rank_color, title

MODEL_PARALLEL_DIMS = ("tp", "ep", "etp")
Events = list[dict[str, Any]]


def rank_events(traces_or_events, rank: int = 0) -> Events:
    """One rank's events from ``{rank: events}`` (load_traces) or an already chosen event list."""
    if isinstance(traces_or_events, dict):
        return traces_or_events.get(rank) or next(iter(traces_or_events.values()), [])
    return list(traces_or_events)


def _placement_events(events: Events, step: int | None) -> Events:
    return [e for e in events if e.get("kind") == "placement" and (step is None or e["step"] == step)]


def transition(events: Events, param: str, step: int | None = 0) -> tuple[dict, dict | None]:
    """The first unshard event of ``param`` in ``step`` and the reshard that follows it (or None)."""
    mine = [e for e in _placement_events(events, step) if e["param"] == param]
    for i, event in enumerate(mine):
        if _shards(event["after"]) < _shards(event["before"]):
            return event, next((e for e in mine[i + 1 :] if e["before"] == event["after"]), None)
    if mine:
        return mine[0], None
    known = sorted({e["param"] for e in _placement_events(events, None)})
    raise ValueError(f"no placement event for {param!r} at step {step}; parameters: {known[:12]}")


def _shards(text: str) -> int:
    return sum(p.kind in ("S", "_S") for p in parse_placements(text))


def representative_param(events: Events, step: int | None = 0) -> str:
    """A parameter worth drawing: changing on the FSDP dim, an expert weight if there is one (a MoE
    run's point: the ep shard kept while efsdp is gathered), else TP/ETP-sharded, else 2-D."""
    best, best_score = None, None
    for order, event in enumerate(_placement_events(events, step)):
        placements = parse_placements(event["before"])
        model_parallel_sharded = any(
            p.kind in ("S", "_S") and dim in MODEL_PARALLEL_DIMS for dim, p in zip(event["mesh_dims"], placements)
        )
        expert = any(p.kind in ("S", "_S") and dim in ("ep", "etp") for dim, p in zip(event["mesh_dims"], placements))
        score = (
            event["before"] != event["after"],
            expert,
            model_parallel_sharded,
            len(event["global_shape"]) == 2,
            "_S(" not in event["before"],
            -order,
        )
        if best_score is None or score > best_score:
            best, best_score = event["param"], score
    if best is None:
        raise ValueError("the trace has no placement events")
    return best


def draw_ownership(ax, global_shape, mesh_dims, placements, dims: ParallelDims, label_blocks: bool = True) -> None:
    """The global tensor as boxes coloured by the rank that holds each (chips: copies on several ranks).

    2-D: rows = axis 0, columns = axis 1; 1-D: one row; n-D: rows are the boxes of the leading axes in
    row-major order. Patches of rank r's colour have ``gid="owner<r>"``, box outlines ``gid="block"``.
    """
    blocks = ownership(global_shape, mesh_dims, placements, dims)
    ndim = len(global_shape)
    row_y, width, height = _block_rows(blocks, global_shape)
    for block in blocks:
        (x0, x1), (y0, h) = _columns(block), row_y[_lead(block, ndim)]
        _draw_block(
            ax,
            x0,
            y0,
            x1 - x0,
            h,
            block.owners,
            dims.world_size,
            label_blocks and (x1 - x0) / width > 0.12 and h / height > 0.1,
        )
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.set_box_aspect(min(1.3, max(0.3, height / width)) if ndim > 1 else 0.22)
    _ownership_ticks(ax, blocks, row_y, global_shape)


def _lead(block, ndim: int) -> tuple:
    """The ranges of the axes a block's row stands for: axis 0 of a 1-D tensor, else every axis but the last."""
    return (block.ranges[0],) if ndim == 1 else block.ranges[:-1]


def _columns(block) -> tuple[int, int]:
    """A block's range along the drawn columns: the last axis (the only one of a 1-D tensor)."""
    return block.ranges[-1]


def _block_rows(blocks, global_shape) -> tuple[dict, float, float]:
    """Each row's (top, height) by its leading ranges (1-D: one row, a sixth of its length high; n-D: rows of
    the leading axes' boxes in row-major order, each as high as it has rows), the width and the height."""
    if len(global_shape) == 1:
        width, height = global_shape[0], max(1.0, global_shape[0] / 6)
        return {(block.ranges[0],): (0.0, height) for block in blocks}, width, height
    row_y, y = {}, 0.0
    for block in blocks:
        key = _lead(block, len(global_shape))
        if key not in row_y:
            extent = 1
            for lo, hi in key:
                extent *= hi - lo
            row_y[key] = (y, float(extent))
            y += extent
    return row_y, global_shape[-1], y


def _ownership_ticks(ax, blocks, row_y: dict, global_shape) -> None:
    """Ticks at the blocks' edges and axis labels; rows of a tensor of more than 2 axes named by their ranges."""
    ndim = len(global_shape)
    xs = sorted({v for b in blocks for v in _columns(b)})
    ax.set_xticks(xs)
    ax.tick_params(labelsize=7)
    ys = sorted({v for y0, h in row_y.values() for v in (y0, y0 + h)})
    ax.set_yticks(ys if ndim == 2 else [])
    if ndim > 2:  # rows are boxes of the leading axes: name each band by its index ranges
        ax.set_yticks(
            [y0 + h / 2 for y0, h in row_y.values()],
            ["[" + ", ".join(f"{lo}:{hi}" for lo, hi in key) + ", :]" for key in row_y],
            fontsize=7,
        )
    if ndim == 1:
        ax.set_xlabel(f"dim 0 (length {global_shape[0]})", fontsize=8)
    else:
        ax.set_xlabel(f"dim {ndim - 1} (columns, {global_shape[-1]})", fontsize=8)
        rows = ", ".join(f"dim {a}" for a in range(ndim - 1))
        ax.set_ylabel(f"rows: boxes of {rows}" if ndim > 2 else f"dim 0 (rows, {global_shape[0]})", fontsize=8)


def _draw_block(ax, x, y, w, h, owners, world: int, label: bool) -> None:
    """One owner: the box filled with its colour. Several: a pale box with one coloured chip per rank."""
    if len(owners) == 1:
        ax.add_patch(
            Rectangle((x, y), w, h, facecolor=rank_color(owners[0], world), edgecolor="none", gid=f"owner{owners[0]}")
        )
        if label:
            ax.text(
                x + w / 2,
                y + h / 2,
                f"rank {owners[0]}",
                ha="center",
                va="center",
                fontsize=8,
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.85, "linewidth": 0},
            )
    else:
        ax.add_patch(Rectangle((x, y), w, h, facecolor="#f2f2f2", edgecolor="none", gid="shared"))
        k = max(len(owners), 1)
        chip_w, chip_h = min(w * 0.9 / k, w * 0.22), min(h * 0.3, h * 0.8)
        left = x + (w - chip_w * k) / 2
        for i, rank in enumerate(owners):
            ax.add_patch(
                Rectangle(
                    (left + i * chip_w, y + (h - chip_h) / 2),
                    chip_w,
                    chip_h,
                    facecolor=rank_color(rank, world),
                    edgecolor="white",
                    linewidth=1,
                    gid=f"owner{rank}",
                )
            )
            if label:
                ax.text(
                    left + (i + 0.5) * chip_w,
                    y + h / 2,
                    str(rank),
                    ha="center",
                    va="center",
                    fontsize=8 if k <= 8 else 6,
                    color="white",
                    fontweight="bold",
                )
        if label:
            text = f"copy on all {world} ranks" if k == world else f"copies on {k} ranks"
            ax.text(x + w / 2, y + (h - chip_h) / 2 - h * 0.04, text, ha="center", va="bottom", fontsize=7.5)
    ax.add_patch(Rectangle((x, y), w, h, facecolor="none", edgecolor="black", linewidth=1.4, gid="block"))


def placement_transitions(
    traces_or_events,
    dims: ParallelDims,
    param: str | None = None,
    step: int = 0,
    rank: int = 0,
    recipe: str | None = None,
) -> Figure:
    """One parameter in three states: sharded -> unsharded (only the FSDP dim gathered) -> resharded.

    A parameter no data-parallel dim shards (DDP, pure TP) is drawn as "stored" and "in compute",
    with a subtitle saying nothing is gathered.

    Each panel draws the global tensor with every block filled by the colours of the ranks holding
    it (computed from the placements and ``dims``' groups, torch.chunk semantics, strided shards
    split by the model-parallel dim first); the placement tuple and rank ``rank``'s local shape are
    in the panel title; between panels every mesh dim says whether it changed ("tp: S(0) kept").
    Axes of the states are labelled ``"state:sharded"``, ``"state:unsharded"``, ``"state:resharded"``.
    """
    events = rank_events(traces_or_events, rank)
    param = param or representative_param(events, step)
    unshard, reshard = transition(events, param, step)
    mesh_dims, shape = unshard["mesh_dims"], unshard["global_shape"]
    gathers = _shards(unshard["after"]) < _shards(unshard["before"])
    states = _states(unshard, reshard, gathers)
    fig = new_figure(4.2 * len(states) + 1.6 * (len(states) - 1), 5.2 if len(shape) > 1 else 3.0)
    ratios = [1.0, 0.38] * (len(states) - 1) + [1.0]
    grid = fig.add_gridspec(1, len(ratios), width_ratios=ratios)
    dims_text = "(" + ", ".join(mesh_dims) + ")"
    for i, (name, placements, note) in enumerate(states):
        ax = fig.add_subplot(grid[0, 2 * i])
        draw_ownership(ax, shape, mesh_dims, placements, dims)
        local = list(local_shape(shape, mesh_dims, placements, dims, rank))
        ax.set_title(
            f"{i + 1}. {name} — {note}\n{dims_text} = {placements}\nrank {rank} holds {local} of {list(shape)}",
            fontsize=9,
        )
        ax.set_label(f"state:{name}")
        if i + 1 < len(states):
            _draw_transition(fig.add_subplot(grid[0, 2 * i + 1]), mesh_dims, placements, states[i + 1][1], i == 0)
    _rank_legend(fig, dims.world_size)
    subtitle = (
        "only the FSDP dim is gathered; model-parallel (TP/EP/ETP) placements never change"
        if gathers
        else "nothing is gathered: not sharded on a data-parallel dim; model-parallel placements never change"
    )
    fig.suptitle(title(f"Placements of {param} (step {step})", recipe, dims) + "\n" + subtitle, fontsize=11)
    return fig


def _states(unshard: dict, reshard: dict | None, gathers: bool) -> list[tuple[str, str, str]]:
    """(name, placements, note) of each panel: as stored, in compute, and after resharding if it does."""
    if gathers:
        states = [
            ("sharded", unshard["before"], "what the optimizer holds"),
            ("unsharded", unshard["after"], f"{unshard['phase']}: computes with this"),
        ]
    else:  # DDP / pure TP: no data-parallel shard, the stored layout is the compute layout
        states = [
            ("stored", unshard["before"], "what the optimizer holds"),
            ("in compute", unshard["after"], f"{unshard['phase']}: the same layout"),
        ]
    if reshard is not None:
        states.append(("resharded", reshard["after"], f"after {reshard['phase']}: back to the shard"))
    return states


def _draw_transition(arrow, mesh_dims: list[str], before: str, after: str, first: bool) -> None:
    """The arrow between two panels: which dims are gathered (or resharded), and every dim's change."""
    arrow.axis("off")
    arrow.set_label("transition")
    gathered = [d for d, b, a in zip(mesh_dims, parse_placements(before), parse_placements(after)) if str(b) != str(a)]
    verb = (
        ("all-gather on " if first else "reshard on ") + ", ".join(gathered)
        if gathered
        else "no communication:\nnot sharded on a data-parallel dim"
    )
    arrow.annotate(
        "",
        xy=(0.95, 0.55),
        xytext=(0.05, 0.55),
        xycoords="axes fraction",
        arrowprops={"arrowstyle": "-|>", "lw": 2, "color": "#333333"},
    )
    arrow.text(0.5, 0.62, verb, ha="center", va="bottom", fontsize=9, fontweight="bold", wrap=True)
    arrow.text(
        0.5, 0.48, "\n".join(changes(mesh_dims, before, after)), ha="center", va="top", fontsize=8.5, family="monospace"
    )


def _rank_legend(fig: Figure, world: int) -> None:
    handles = [Patch(facecolor=rank_color(r, world), edgecolor="black", label=f"rank {r}") for r in range(world)]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(world, 8),
        fontsize=8,
        title="colour = the rank holding the block; grey block with chips = a copy on each of those ranks",
        title_fontsize=8,
    )


def _unit_of(param: str, units: set[str]) -> str:
    matches = [u for u in units if param.startswith(u + ".")]
    return max(matches, key=len) if matches else "root"


def _overview_rows(
    events: Events, dims: ParallelDims, module: str | None, step: int, rank: int
) -> tuple[list[list[str]], set[str], set[str]]:
    """One row per parameter at its first unshard of ``step``, and the mesh dims whose placement changed
    between sharded and unsharded and those kept."""
    units = {e["module"] for e in events if e.get("kind") == "collective" and e.get("module")} - {"root"}
    rows, changed, kept, seen = [], set(), set(), set()
    for event in _placement_events(events, step):
        name = event["param"]
        if name in seen or (module and not (name == module or name.startswith(module + "."))):
            continue
        seen.add(name)
        unshard, _ = transition(events, name, step)
        mesh_dims, shape = unshard["mesh_dims"], unshard["global_shape"]
        for dim, b, a in zip(mesh_dims, parse_placements(unshard["before"]), parse_placements(unshard["after"])):
            (changed if str(b) != str(a) else kept).add(dim)
        rows.append(
            [
                _unit_of(name, units),
                name,
                str(list(shape)),
                ", ".join(mesh_dims),
                unshard["before"],
                unshard["after"],
                str(list(local_shape(shape, mesh_dims, unshard["before"], dims, rank))),
                str(list(local_shape(shape, mesh_dims, unshard["after"], dims, rank))),
            ]
        )
    if not rows:
        raise ValueError(f"no parameters under {module!r} at step {step}")
    return rows, changed, kept


def _overview_table(fig: Figure, rows: list[list[str]], header: list[str]) -> None:
    """The rows as a table: columns as wide as their text, units shaded in turn, the unsharded column in blue."""
    ax = fig.add_subplot()
    ax.axis("off")
    ax.set_label("overview")
    table = ax.table(cellText=rows, colLabels=header, loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    widths = [max(len(str(r[c])) for r in rows + [header]) + 2 for c in range(len(header))]
    unit_order = list(dict.fromkeys(r[0] for r in rows))
    for (row, col), cell in table.get_celld().items():
        cell.set_height(1.0 / (len(rows) + 1))
        cell.set_width(widths[col] / sum(widths))
        cell.PAD = 0.03
        if row == 0:
            cell.set_facecolor("#d9d9d9")
            cell.get_text().set_fontweight("bold")
        elif unit_order.index(rows[row - 1][0]) % 2:
            cell.set_facecolor("#f3f3f3")
        if row > 0 and col == 5:
            cell.get_text().set_color("#1f4e9e")


def placement_overview(
    traces_or_events,
    dims: ParallelDims,
    module: str | None = None,
    step: int = 0,
    rank: int = 0,
    recipe: str | None = None,
) -> Figure:
    """A table of every parameter (of ``module``, a name prefix such as "layers.0"; None: all): unit,
    name, global shape, mesh dims, sharded and unsharded placements, rank ``rank``'s local shapes.
    The footnote lists which mesh dims changed between sharded and unsharded (only the FSDP dim should)."""
    rows, changed, kept = _overview_rows(rank_events(traces_or_events, rank), dims, module, step, rank)
    header = [
        "unit",
        "parameter",
        "global shape",
        "mesh dims",
        "sharded",
        "unsharded",
        f"rank {rank} local (sharded)",
        f"rank {rank} local (unsharded)",
    ]
    fig = new_figure(15, 0.9 + 0.26 * (len(rows) + 1))
    _overview_table(fig, rows, header)
    note = f"changed between sharded and unsharded: {', '.join(sorted(changed)) or 'nothing'}"
    note += f"   ·   kept: {', '.join(sorted(kept - changed)) or 'nothing'}"
    fig.suptitle(
        title(f"Parameter placements{' of ' + module if module else ''} (step {step})", recipe, dims) + "\n" + note,
        fontsize=10,
    )
    return fig
