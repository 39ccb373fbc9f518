"""``hyper_parallel.viz.mesh_map``: one panel per mesh dim whose cells are the ranks and whose colours are
that dim's groups, checked from the figure's artists against ``ParallelDims.group_ranks`` (itself checked
against hand-derived lists in tests/test_mesh_group_ranks.py), and panel titles that fit inside the figure
(measured from the rendered title boxes). No workers are started.
"""

from __future__ import annotations

import pytest
from matplotlib.colors import to_rgba

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.viz import mesh_map


@pytest.mark.parametrize(
    "dims, panels",
    [
        (
            ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, tp=2),
            [MeshDim.DP_REPLICATE, MeshDim.DP_SHARD, MeshDim.TP],
        ),
        (ParallelDims(world_size=8, dp_shard=2, cp=2, tp=2), [MeshDim.DP_SHARD, MeshDim.CP, MeshDim.TP, MeshDim.FSDP]),
        (
            ParallelDims(world_size=4, dp_shard=2, tp=2, ep=2, etp=2),
            [MeshDim.DP_SHARD, MeshDim.TP, MeshDim.EP, MeshDim.ETP],
        ),
        (ParallelDims(world_size=8, dp_shard=8, ep=2), [MeshDim.DP_SHARD, MeshDim.EFSDP, MeshDim.EP]),
        (ParallelDims(world_size=4, pp=2, dp_shard=2), [MeshDim.PP, MeshDim.DP_SHARD]),  # the stages too
    ],
)
def test_mesh_map_cells_are_ranks_and_colours_are_groups(dims, panels):
    fig = mesh_map(dims, recipe="X")
    assert [ax.get_label().removeprefix("mesh:") for ax in fig.axes] == panels
    for ax in fig.axes:
        dim = ax.get_label().removeprefix("mesh:")
        cells = {p.get_gid(): p for p in ax.patches}
        numbers = {t.get_gid(): t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("rank")}
        assert numbers == {f"rank{r}": str(r) for r in range(dims.world_size)}
        for text in (t for t in ax.texts if (t.get_gid() or "").startswith("rank")):
            assert cells[text.get_gid()].contains_point(ax.transData.transform(text.get_position()))
        by_colour = {}
        for rank in range(dims.world_size):
            by_colour.setdefault(to_rgba(cells[f"rank{rank}"].get_facecolor()), []).append(rank)
        assert sorted(by_colour.values()) == sorted(dims.group_ranks(dim))
    assert "X" in fig._suptitle.get_text() and f"world {dims.world_size}" in fig._suptitle.get_text()
    product = 1  # the title's equation holds: world = the product of the dense degrees it names
    for part in fig._suptitle.get_text().split(" = ", 1)[1].split("\n")[0].split(" · ")[0].split(" × "):
        product *= int(part.split()[1].rstrip(","))
    assert product == dims.world_size, fig._suptitle.get_text()


@pytest.mark.parametrize(
    "dims, recipe",
    [
        (ParallelDims(world_size=2, cp=2), "M5"),
        (ParallelDims(world_size=8, dp_shard=2, cp=2, tp=2), "M6"),
        (ParallelDims(world_size=2, dp_shard=2), "M1"),
    ],
)
def test_mesh_panel_titles_are_not_cut(dims, recipe):
    """Every panel title lies inside the figure (04's M5 title was cut at "reduce-scatt"), and a dim
    that is also fsdp explains both jobs."""
    fig = mesh_map(dims, recipe)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.title.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, (ax.get_label(), ax.get_title(), box, fig.bbox)
    if recipe == "M5":
        assert "reduce-scatter" in fig.axes[0].get_title() and "sequence" in fig.axes[0].get_title()
