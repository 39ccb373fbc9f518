"""The ranks laid out on the device mesh: one panel per parallel dim, cells coloured by process group."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.viz.style import group_color, new_figure, title

DENSE_DIMS = (MeshDim.PP, MeshDim.DP_REPLICATE, MeshDim.DP_SHARD, MeshDim.CP, MeshDim.ULYSSES, MeshDim.TP, MeshDim.FSDP)
SPARSE_DIMS = (MeshDim.EFSDP, MeshDim.EP, MeshDim.ETP)
EXPLAIN = {
    "pp": "pipeline stages: send/recv activations",
    "dp_replicate": "replicas: all-reduce gradients",
    "dp_shard": "shard parameters",
    "cp": "split the sequence (K/V all-gather or ring)",
    "ulysses": "split the sequence again, heads by all-to-all",
    "tp": "split weights (tensor parallel)",
    "fsdp": "shard parameters: all-gather / reduce-scatter",
    "efsdp": "shard expert parameters",
    "ep": "own different experts (all-to-all)",
    "etp": "split each expert's hidden dim",
}


def parameters_sharded(metrics: dict) -> bool:
    """Whether a run shards parameters on a data-parallel dim: some fully_shard unit of its
    ``metrics.json`` has shard_size > 1 (True when the run lists no units: the mesh decides)."""
    units = metrics.get("units") or []
    return not units or any(unit.get("shard_size", 1) > 1 for unit in units)


def grid_shape(dims: ParallelDims) -> tuple[int, int]:
    """(rows, cols) of the rank grid: the innermost dims (tp, cp, dp_shard, ...) fill a row until it
    is at least as long as the grid is tall; rank r sits at (r // cols, r % cols) in every panel."""
    cols = 1
    for size in (dims.tp, dims.cp, dims.dp_shard, dims.dp_replicate, dims.pp):
        if cols * cols >= dims.world_size:
            break
        cols *= size
    return dims.world_size // cols, cols


def panels(dims: ParallelDims, sharded: bool = True) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Dense and sparse panels as (dim, heading); dims of size 1 and duplicates are left out
    (fsdp is shown separately only when it differs from both dp_shard and cp). ``sharded=False``: the
    run does not shard parameters (DDP, pure TP: ``enable_param_shard=False``), so dp_shard is named
    a plain data-parallel dim, never "fsdp"."""
    dense = []
    for dim in DENSE_DIMS:
        size = getattr(dims, dim)
        if size <= 1:
            continue
        heading = f"{dim} = {size}"
        if dim == "dp_shard" and dims.fsdp == size and sharded:
            heading = f"dp_shard = fsdp = {size}"
        elif dim == "cp" and dims.fsdp == size and sharded:
            heading = f"cp = fsdp = {size}"
        elif dim == "fsdp":
            if size in (dims.dp_shard, dims.cp) or not sharded:
                continue
            factors = [n for n in (MeshDim.DP_SHARD, MeshDim.CP, MeshDim.ULYSSES) if getattr(dims, n) > 1]
            heading = f"fsdp = {' × '.join(factors)} = {size}"
        dense.append((dim, heading))
    sparse = []
    if dims.ep > 1:
        for dim in SPARSE_DIMS:
            size = getattr(dims, dim)
            if size > 1:
                heading = f"{dim} = {size}" + (" = dp_shard·cp·tp / (ep·etp)" if dim == "efsdp" else "")
                sparse.append((dim, heading))
    return dense, sparse


def explanation(dim: str, heading: str, sharded: bool = True) -> str:
    """What a panel's dim does in this run: an unsharded run's dp_shard only replicates, and a dim
    that is also fsdp ("cp = fsdp") does both of its jobs."""
    if dim == "dp_shard" and not sharded:
        return "data-parallel replicas: parameters not sharded, gradients all-reduced"
    if "= fsdp" in heading and dim != "dp_shard":
        return f"{EXPLAIN[dim]};\n{EXPLAIN['fsdp']}"
    return EXPLAIN.get(dim, "")


def _draw_panel(ax, dims: ParallelDims, dim: str, heading: str, rows: int, cols: int, sharded: bool = True) -> None:
    groups = dims.group_ranks(dim)
    index = {rank: g for g, group in enumerate(groups) for rank in group}
    for rank in range(dims.world_size):
        row, col = divmod(rank, cols)
        cell = Rectangle(
            (col, row), 1, 1, facecolor=group_color(index[rank]), edgecolor="black", linewidth=1.2, gid=f"rank{rank}"
        )
        ax.add_patch(cell)
        ax.text(
            col + 0.5,
            row + 0.45,
            str(rank),
            ha="center",
            va="center",
            fontsize=15 if cols <= 4 else 12,
            fontweight="bold",
            gid=f"rank{rank}",
        )
        ax.text(
            col + 0.5,
            row + 0.82,
            f"{dim}[{dims.coordinates(rank)[dim]}]",
            ha="center",
            va="center",
            fontsize=7.5,
            color="#444444",
            gid="coordinate",
        )
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"{heading}\n{explanation(dim, heading, sharded)}", fontsize=10)
    shown = groups if len(groups) <= 4 else groups[:3]
    listing = "  ".join("{" + ",".join(map(str, g)) + "}" for g in shown)
    if len(groups) > len(shown):
        listing += f"  … ({len(groups)} groups)"
    ax.set_xlabel(f"groups: {listing}", fontsize=8.5)
    ax.set_label(f"mesh:{dim}")


def mesh_map(dims: ParallelDims, recipe: str | None = None, sharded: bool = True) -> Figure:
    """The ranks of ``dims`` on the mesh, one panel per parallel dim of size > 1.

    Every panel shows all ranks at the same place (rank r at row r // cols, column r % cols, TP the
    innermost/contiguous dim); cells of the same colour form one process group of that dim and the
    number in a cell is the global rank. With ep > 1 a second row shows the sparse (expert) view.
    Each panel's axes is labelled ``"mesh:<dim>"``; cell patches carry ``gid="rank<r>"``. ``sharded``:
    whether the run shards parameters (False for DDP and pure TP: no panel then says "fsdp"). Each
    panel is at least as wide as its title, so no title is cut.
    """
    dense, sparse = panels(dims, sharded)
    if not dense and not sparse:
        dense = [("dp_shard", "single rank: nothing is parallel")]
    rows, cols = grid_shape(dims)
    ncols = max(len(dense), len(sparse), 1)
    nrows = 2 if sparse else 1
    cell = 0.85 if cols <= 4 else 0.6
    longest = max(
        (
            len(line)
            for dim, heading in dense + sparse
            for line in (heading, *explanation(dim, heading, sharded).split("\n"))
        ),
        default=0,
    )
    width = max(4.0, ncols * max(2.4, cols * cell + 0.6, 0.095 * longest + 0.4))
    height = nrows * (rows * cell + 1.6) + 0.7
    fig = new_figure(width, height)
    grid = fig.add_gridspec(nrows, ncols)
    for r, row_panels in enumerate([dense, sparse][:nrows]):
        for c, (dim, heading) in enumerate(row_panels):
            _draw_panel(fig.add_subplot(grid[r, c]), dims, dim, heading, rows, cols, sharded)
    lines = [
        title("Device mesh", recipe, dims),
        "number = global rank, small text = its index on that dim, same colour = one process group of that dim",
    ]
    if sparse:
        lines.append(
            "top row: dense view (pp, dp_replicate, dp_shard, cp, tp) · bottom row: expert view "
            f"(dp_replicate, efsdp, ep{', etp' if dims.etp > 1 else ''})"
        )
    fig.set_figwidth(max(width, 0.085 * max(map(len, lines))))
    fig.suptitle("\n".join(lines), fontsize=10.5)
    return fig
