"""Figures of hyper_parallel.viz, checked from their artists on synthetic traces (no workers started)."""

from __future__ import annotations

import json

import pytest
from matplotlib.colors import to_rgba
from matplotlib.patches import Rectangle

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.viz import (
    clock_offsets,
    comm_volume,
    mesh_map,
    numerics,
    placement_overview,
    placement_transitions,
    rank_color,
    rank_ranges,
    run_figures,
    save,
    theoretical_bytes,
    timeline,
    wire_factor,
)
from hyper_parallel.viz.placements import representative_param

FSDP_TP = ParallelDims(world_size=4, dp_shard=2, tp=2)  # fsdp view (dp_replicate, fsdp, tp): rank = 2*fsdp + tp


def _axes(fig, label):
    return next(ax for ax in fig.axes if ax.get_label() == label)


def _coll(op, group, ranks, nbytes, phase, module, step, t0, t1):
    return {
        "kind": "collective",
        "op": op,
        "group": group,
        "ranks": ranks,
        "bytes": nbytes,
        "dtype": "float32",
        "phase": phase,
        "module": module,
        "step": step,
        "t_start": t0,
        "t_end": t1,
    }


def _place(param, before, after, shape, phase, step, t, mesh_dims=("fsdp", "tp")):
    return {
        "kind": "placement",
        "param": param,
        "mesh_dims": list(mesh_dims),
        "before": before,
        "after": after,
        "local_shape": [1],
        "global_shape": list(shape),
        "phase": phase,
        "step": step,
        "t": t,
    }


# ----- placements -----
def _fsdp_tp_events():
    return [
        _place("w", "(S(1), S(0))", "(R, S(0))", (4, 4), "forward", 0, 0.1),
        _place("norm", "(S(0), R)", "(R, R)", (4,), "forward", 0, 0.1),
        _place("w", "(R, S(0))", "(S(1), S(0))", (4, 4), "forward", 0, 0.2),
        _place("norm", "(R, R)", "(S(0), R)", (4,), "forward", 0, 0.2),
    ]


def _owners_by_block(ax, half=2):
    """{(row-half, col-half) of a block's corner: sorted ranks whose colour is drawn inside the block}."""
    colours = {rank_color(r, 4): r for r in range(4)}
    blocks = [p for p in ax.patches if p.get_gid() == "block"]
    owners = {}
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and (patch.get_gid() or "").startswith("owner"):
            x, y = patch.get_x() + patch.get_width() / 2, patch.get_y() + patch.get_height() / 2
            rank = colours[to_rgba(patch.get_facecolor())]
            assert patch.get_gid() == f"owner{rank}"
            (block,) = [
                b
                for b in blocks
                if b.get_x() <= x <= b.get_x() + b.get_width() and b.get_y() <= y <= b.get_y() + b.get_height()
            ]
            owners.setdefault((int(block.get_y() // half), int(block.get_x() // half)), []).append(rank)
    assert len(owners) == len(blocks)
    return {block: sorted(ranks) for block, ranks in owners.items()}


def test_placement_grid_colours_are_the_owner_ranks_fsdp_tp():
    fig = placement_transitions(_fsdp_tp_events(), FSDP_TP, param="w", recipe="B-1")
    # (fsdp, tp) placements (S(1), S(0)) of a [4, 4] weight: rows split by tp, columns by fsdp;
    # block (row-half i, col-half j) belongs to the rank with fsdp=j, tp=i, i.e. rank 2*j + i.
    sharded = {(0, 0): [0], (0, 1): [2], (1, 0): [1], (1, 1): [3]}
    assert _owners_by_block(_axes(fig, "state:sharded")) == sharded
    assert _owners_by_block(_axes(fig, "state:resharded")) == sharded
    # unsharded (R, S(0)): each row-half is held whole by the two ranks of that tp index
    unsharded = _owners_by_block(_axes(fig, "state:unsharded"))
    assert unsharded == {(0, 0): [0, 2], (1, 0): [1, 3]}
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "tp: S(0) kept" in texts and "fsdp: S(1) → R" in texts and "fsdp: R → S(1)" in texts
    assert "(fsdp, tp) = (S(1), S(0))" in _axes(fig, "state:sharded").get_title()
    assert "B-1" in fig._suptitle.get_text()


def test_rank_ranges_strided_and_uneven():
    # _S(0, 2) on fsdp then S(0) on tp: split over tp first, each tp half over fsdp
    ranges = rank_ranges((8, 4), ("fsdp", "tp"), "(_S(0, 2), S(0))", FSDP_TP)
    assert {r: ranges[r][0] for r in range(4)} == {0: (0, 2), 2: (2, 4), 1: (4, 6), 3: (6, 8)}
    assert all(ranges[r][1] == (0, 4) for r in range(4))
    # torch.chunk semantics: 5 rows over 4 ranks -> 2, 2, 1, 0
    dims = ParallelDims(world_size=4, dp_shard=4)
    assert [rank_ranges((5,), ("fsdp",), "(S(0))", dims)[r][0] for r in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 5)]
    # flattened dim name and the sparse view: experts S(0) over ep, hidden S(2) over etp
    moe = ParallelDims(world_size=4, dp_shard=2, tp=2, ep=2, etp=2)
    experts = rank_ranges((4, 8, 6), ("dp_replicate+efsdp", "ep", "etp"), "(R, S(0), S(2))", moe)
    assert experts[3] == [(2, 4), (0, 8), (3, 6)] and experts[0] == [(0, 2), (0, 8), (0, 3)]


def test_representative_param_and_overview():
    events = _fsdp_tp_events()
    assert representative_param(events) == "w"
    fig = placement_overview(events, FSDP_TP, recipe="B-1")
    cells = _axes(fig, "overview").tables[0].get_celld()
    rows = {
        cells[(r, 1)].get_text().get_text(): [cells[(r, c)].get_text().get_text() for c in range(8)] for r in (1, 2)
    }
    assert rows["w"][2:] == ["[4, 4]", "fsdp, tp", "(S(1), S(0))", "(R, S(0))", "[2, 2]", "[2, 4]"]
    assert rows["norm"][4:] == ["(S(0), R)", "(R, R)", "[2]", "[4]"]
    assert "changed between sharded and unsharded: fsdp" in fig._suptitle.get_text()
    assert "kept: tp" in fig._suptitle.get_text()


# ----- mesh map -----
@pytest.mark.parametrize(
    "dims, panels",
    [
        (ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, tp=2), ["dp_replicate", "dp_shard", "tp"]),
        (ParallelDims(world_size=8, dp_shard=2, cp=2, tp=2), ["dp_shard", "cp", "tp", "fsdp"]),
        (ParallelDims(world_size=4, dp_shard=2, tp=2, ep=2, etp=2), ["dp_shard", "tp", "ep", "etp"]),
        (ParallelDims(world_size=8, dp_shard=8, ep=2), ["dp_shard", "efsdp", "ep"]),
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


# ----- timeline -----
def _hsdp_traces(offset=0.0):
    """4 ranks, HSDP (dp_replicate=2 x fsdp=2), two steps of: AG a, AG root (fwd), AG a, RS a, AR a,
    RS root, AR root (bwd); rank 1's clock runs ``offset`` seconds ahead."""
    dims = ParallelDims(world_size=4, dp_replicate=2, dp_shard=2)
    traces = {}
    for rank in range(4):
        fsdp, rep = dims.group_of("fsdp", rank), dims.group_of("dp_replicate", rank)
        shift = offset if rank == 1 else 0.0
        events = [_coll("broadcast", "fsdp", fsdp, 64, "init", "", 0, 0.0 + shift, 0.01 + shift)]
        for step in range(2):
            t = 1.0 * step + 0.1 + shift
            plan = [
                ("all_gather", "fsdp", fsdp, 2000, "forward", "a"),
                ("all_gather", "fsdp", fsdp, 400, "forward", "root"),
                ("all_gather", "fsdp", fsdp, 2000, "backward", "a"),
                ("reduce_scatter", "fsdp", fsdp, 2000, "backward", "a"),
                ("all_reduce", "dp_replicate", rep, 1000, "backward", "a"),
                ("reduce_scatter", "fsdp", fsdp, 400, "backward", "root"),
                ("all_reduce", "dp_replicate", rep, 200, "backward", "root"),
            ]
            for i, (op, group, ranks, nbytes, phase, module) in enumerate(plan):
                events.append(_coll(op, group, ranks, nbytes, phase, module, step, t + 0.05 * i, t + 0.05 * i + 0.02))
            events.append(_place("p", "(R, S(0))", "(R, R)", (4,), "forward", step, t + 0.3, ("dp_replicate", "fsdp")))
        traces[rank] = events
    return dims, traces


HSDP_UNITS = [
    {
        "unit": "a",
        "mp_local_bytes": 2000,
        "shard_size": 2,
        "dp_size": 2,
        "reshard_after_forward": True,
        "sharded_group": {"name": "fsdp", "ranks": [0, 1]},
        "unsharded_group": {"name": "dp_replicate", "ranks": [0, 2]},
    },
    {
        "unit": "root",
        "mp_local_bytes": 400,
        "shard_size": 2,
        "dp_size": 2,
        "reshard_after_forward": False,
        "sharded_group": {"name": "fsdp", "ranks": [0, 1]},
        "unsharded_group": {"name": "dp_replicate", "ranks": [0, 2]},
    },
]


def _bars(fig, gid="collective"):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def test_timeline_draws_one_bar_per_collective_of_the_step():
    dims, traces = _hsdp_traces()
    for step in (None, 0):  # default: the last step; init-phase collectives are not part of a step
        fig = timeline(traces, step=step, recipe="M7", degrees=dims)
        chosen = 1 if step is None else 0
        expected = sum(
            1
            for events in traces.values()
            for e in events
            if e["kind"] == "collective" and e["step"] == chosen and e["phase"] != "init"
        )
        assert len(_bars(fig)) == expected == 28
        assert f"step {chosen}" in fig._suptitle.get_text()
    fig = timeline(traces, by_group=True)
    labels = [t.get_text() for t in _axes(fig, "timeline").get_yticklabels()]
    assert labels[:2] == ["rank 0 · fsdp", "rank 0 · dp_replicate"]
    # HSDP: on rank 0 each unit's reduce-scatter on fsdp is followed by its all-reduce on dp_replicate
    rank0 = sorted((p.get_x(), p.get_y()) for p in _bars(fig) if p.get_y() < 1.5)
    rows = [round(y + 0.38) for _, y in rank0]
    assert rows == [0, 0, 0, 0, 1, 0, 1]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"all_gather", "reduce_scatter", "all_reduce", "group fsdp", "group dp_replicate"} <= set(legend)


def test_clock_offsets_are_recovered_from_collective_ends():
    _, traces = _hsdp_traces(offset=0.05)
    offsets = clock_offsets(traces)
    assert offsets[0] == pytest.approx(0.0, abs=1e-6) and offsets[1] == pytest.approx(0.05, abs=1e-6)
    assert offsets[2] == pytest.approx(0.0, abs=1e-6) and offsets[3] == pytest.approx(0.0, abs=1e-6)
    fig = timeline(traces, by_group=False)
    starts = {round(p.get_y() + 0.38): p.get_x() for p in _bars(fig)}
    assert starts[0] == pytest.approx(starts[1])


# ----- communication volume -----
def test_theoretical_bytes_fsdp_and_hsdp():
    fsdp = [dict(u, dp_size=1) for u in HSDP_UNITS]
    # unit a: AG 2000 in forward + 2000 in backward (resharded after forward), RS 2000;
    # root: AG 400 once (kept unsharded until backward), RS 400
    assert theoretical_bytes(fsdp) == {("all_gather", "fsdp"): 4400, ("reduce_scatter", "fsdp"): 2400}
    # HSDP adds one all-reduce of mp-local bytes / shard_size per unit: 2000/2 + 400/2
    assert theoretical_bytes(HSDP_UNITS) == {
        ("all_gather", "fsdp"): 4400,
        ("reduce_scatter", "fsdp"): 2400,
        ("all_reduce", "dp_replicate"): 1200,
    }
    # DDP through fully_shard (shard_size 1): all-reduce of everything on the unsharded group only
    ddp = [dict(HSDP_UNITS[0], shard_size=1, dp_size=4, unsharded_group={"name": "dp_shard", "ranks": [0, 1, 2, 3]})]
    assert theoretical_bytes(ddp) == {("all_reduce", "dp_shard"): 2000}
    # 8-way fsdp, 3000 bytes, no reshard after forward; 2 replicas: AR 3000/8
    big = [dict(HSDP_UNITS[0], mp_local_bytes=3000, shard_size=8, reshard_after_forward=False)]
    assert theoretical_bytes(big)[("all_reduce", "dp_replicate")] == 375
    assert wire_factor("all_gather", 4) == 0.75 and wire_factor("all_reduce", 4) == 1.5
    assert wire_factor("reduce_scatter", 1) == 0


def test_comm_volume_bars_and_ratios():
    dims, traces = _hsdp_traces()
    traces[0].append(_coll("all_gather", "fsdp", [0, 1], 440, "forward", "root", 1, 1.9, 1.91))  # padding/extra
    metrics = {"recipe": "M7", "degrees": dims.degrees(), "units": HSDP_UNITS}
    fig = comm_volume(traces, metrics)
    ax = _axes(fig, "volume")
    measured = sorted(p.get_height() for p in ax.patches if p.get_gid() == "measured")
    theory = sorted(p.get_height() for p in ax.patches if p.get_gid() == "theory")
    assert measured == [1200, 2400, 4840] and theory == [1200, 2400, 4400]
    notes = [t.get_text().split("\n")[0] for t in ax.texts]
    assert notes == ["×1.10 of min", "×1.00 of min", "×1.00 of min"]
    wire = _axes(fig, "wire")
    per_rank = {}
    for p in wire.patches:
        per_rank[round(p.get_x() + p.get_width() / 2)] = (
            per_rank.get(round(p.get_x() + p.get_width() / 2), 0) + p.get_height()
        )
    # rank 1: (4400 AG + 2400 RS) * 1/2 + 1200 AR * 2 * 1/2
    assert per_rank[1] == pytest.approx(3400 + 1200)


# ----- numerics, save, run_figures -----
def test_numerics_plots_losses_against_reference():
    metrics = {
        "recipe": "M4",
        "degrees": {"world_size": 2, "dp_shard": 2},
        "losses": [2.0, 1.5, 1.25],
        "reference_losses": [2.0, 1.5000001, 1.25],
        "max_abs_diff": 1e-7,
        "max_param_diff": 2e-8,
        "ok": True,
    }
    fig = numerics(metrics)
    lines = {line.get_label(): list(line.get_ydata()) for line in _axes(fig, "loss").lines}
    assert lines == {"run": [2.0, 1.5, 1.25], "single-process reference": [2.0, 1.5000001, 1.25]}
    assert "1.00e-07" in fig._suptitle.get_text() and "M4" in fig._suptitle.get_text()


def test_run_figures_of_a_run_dir(tmp_path):
    dims, traces = _hsdp_traces()
    for rank, events in traces.items():
        (tmp_path / f"trace_rank{rank}.json").write_text(json.dumps({"rank": rank, "world_size": 4, "events": events}))
    (tmp_path / "metrics.json").write_text(
        json.dumps(
            {
                "recipe": "M7",
                "degrees": dims.degrees(),
                "units": HSDP_UNITS,
                "losses": [3.0, 2.5],
                "reference_losses": [3.0, 2.5],
                "max_abs_diff": 0.0,
            }
        )
    )
    figures = run_figures(tmp_path)
    assert list(figures) == ["mesh", "placements", "placement_overview", "timeline", "comm_volume", "numerics"]
    png, svg = save(figures["mesh"], tmp_path / "out", "mesh")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:400]


def test_figures_display_as_png_in_ipython(monkeypatch):
    import types

    from IPython.core.formatters import PNGFormatter

    from hyper_parallel import viz

    formatter = PNGFormatter()
    shell = types.SimpleNamespace(display_formatter=types.SimpleNamespace(formatters={"image/png": formatter}))
    monkeypatch.setitem(__import__("sys").modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    viz._enable_notebook_display()
    png = formatter(mesh_map(ParallelDims(world_size=2, dp_shard=2)))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


# ----- runs that shard nothing (DDP, pure TP) and MoE runs: what the figures say (issue 19) -----
def test_unsharded_run_says_nothing_is_gathered_and_never_fsdp():
    """M1 (DDP) on dp_shard=2: the parameter is (R, R) before and after, so no panel says "sharded",
    the subtitle says nothing is gathered, and the mesh calls dp_shard a replica dim, not fsdp."""
    dims = ParallelDims(world_size=2, dp_shard=2)
    events = [_place("w", "(R, R)", "(R, R)", (4, 4), "forward", 0, 0.1, ("dp_replicate", "fsdp"))]
    fig = placement_transitions(events, dims, recipe="M1")
    titles = [ax.get_title() for ax in fig.axes if ax.get_label().startswith("state:")]
    assert [ax.get_label() for ax in fig.axes if ax.get_label().startswith("state:")] == [
        "state:stored",
        "state:in compute",
    ]
    assert not any("sharded" in t for t in titles), titles
    suptitle = fig._suptitle.get_text()
    assert "nothing is gathered" in suptitle and "only the FSDP dim is gathered" not in suptitle
    unsharded = mesh_map(dims, "M1", sharded=False)
    [ax] = unsharded.axes
    assert "fsdp" not in ax.get_title() and "not sharded" in ax.get_title()
    assert "dp_shard = fsdp = 2" in mesh_map(dims, "M4").axes[0].get_title()  # FSDP keeps its name


def test_sharded_run_keeps_the_fsdp_subtitle():
    fig = placement_transitions(_fsdp_tp_events(), FSDP_TP, param="w", recipe="B-1")
    assert "only the FSDP dim is gathered" in fig._suptitle.get_text()
    assert [ax.get_label() for ax in fig.axes if ax.get_label().startswith("state:")] == [
        "state:sharded",
        "state:unsharded",
        "state:resharded",
    ]


def test_parameters_sharded_reads_the_units():
    from hyper_parallel.viz import parameters_sharded

    assert parameters_sharded({"units": [{"shard_size": 1}, {"shard_size": 2}]})
    assert not parameters_sharded({"units": [{"shard_size": 1}, {"shard_size": 1}]})
    assert parameters_sharded({})  # no units listed: the mesh decides


def test_representative_param_of_a_moe_run_is_an_expert_weight():
    """S1: a 2-D TP-free dense weight gathered on fsdp and a 3-D expert weight [4, 8, 4], S(0) on ep,
    gathered on efsdp: the figure shows the expert weight (the 3-D tensor is no longer skipped), with
    the ep shard kept: rank 0 (ep 0) holds experts 0-1, half of their rows while sharded on efsdp."""
    dims = ParallelDims(world_size=4, dp_shard=4, ep=2)
    sparse = ("dp_replicate", "efsdp", "ep")
    events = [
        _place("tok_embeddings.weight", "(R, S(0))", "(R, R)", (8, 4), "forward", 0, 0.1, ("dp_replicate", "fsdp")),
        _place("layers.1.experts.w1", "(R, S(1), S(0))", "(R, R, S(0))", (4, 8, 4), "forward", 0, 0.2, sparse),
        _place("layers.1.experts.w1", "(R, R, S(0))", "(R, S(1), S(0))", (4, 8, 4), "forward", 0, 0.3, sparse),
    ]
    assert representative_param(events) == "layers.1.experts.w1"
    # S2-like: a TP-sharded 2-D weight next to it used to win (2-D preferred); the expert weight wins now
    tp_weight = _place(
        "layers.0.attention.wq.weight",
        "(R, S(1), S(0))",
        "(R, R, S(0))",
        (8, 8),
        "forward",
        0,
        0.05,
        ("dp_replicate", "fsdp", "tp"),
    )
    assert representative_param([tp_weight] + events) == "layers.1.experts.w1"
    fig = placement_transitions(events, dims, recipe="S1")
    sharded = _axes(fig, "state:sharded")
    assert "rank 0 holds [2, 4, 4] of [4, 8, 4]" in sharded.get_title()
    assert "rank 0 holds [2, 8, 4]" in _axes(fig, "state:unsharded").get_title()


@pytest.mark.parametrize(
    "dims, recipe",
    [
        (ParallelDims(world_size=2, cp=2), "M5"),
        (ParallelDims(world_size=8, dp_shard=2, cp=2, tp=2), "M6"),
        (ParallelDims(world_size=2, dp_shard=2), "M1"),
    ],
)
def test_mesh_panel_titles_are_not_cut(dims, recipe):
    """Every panel title lies inside the figure (12's M5 title was cut at "reduce-scatt"), and a dim
    that is also fsdp explains both jobs."""
    fig = mesh_map(dims, recipe)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.title.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, (ax.get_label(), ax.get_title(), box, fig.bbox)
    if recipe == "M5":
        assert "reduce-scatter" in fig.axes[0].get_title() and "sequence" in fig.axes[0].get_title()


def test_run_figures_titles_name_the_run_by_its_label(tmp_path):
    """A run of M7 with cp as its shard dim is "M7+CP" in its notebook: the figures say so too."""
    import json

    from hyper_parallel.viz import run_figures

    metrics = {"recipe": "M7", "degrees": {"world_size": 4, "dp_replicate": 2, "dp_shard": 1, "cp": 2}}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    titles = {
        name: fig._suptitle.get_text() if fig._suptitle else " ".join(ax.get_title() for ax in fig.axes)
        for name, fig in run_figures(tmp_path, label="M7+CP").items()
    }
    assert titles and all("M7+CP" in text for text in titles.values()), titles
