"""The figures of a whole run: ``numerics`` (losses against the single-process reference), ``run_figures``
of a run directory written by hand into ``tmp_path`` (which figures, in which order, titled by the run's
label), ``save`` (PNG and SVG file signatures) and the PNG display hook for IPython. Expected values are the
ones written into the synthetic metrics and traces (no workers started).
"""

from __future__ import annotations

import json

import pytest
from viz_traces import HSDP_UNITS, axes_labelled, hsdp_traces

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.viz import mesh_map, numerics, run_figures, save


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
    lines = {line.get_label(): list(line.get_ydata()) for line in axes_labelled(fig, "loss").lines}
    assert lines == {"run": [2.0, 1.5, 1.25], "single-process reference": [2.0, 1.5000001, 1.25]}
    assert "1.00e-07" in fig._suptitle.get_text() and "M4" in fig._suptitle.get_text()


def test_run_figures_of_a_run_dir(tmp_path):
    dims, traces = hsdp_traces()
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
    png, svg = save(figures["mesh"], tmp_path / "out", "mesh", svg=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:400]
    saved = run_figures(tmp_path, out_dir=tmp_path / "lazy")
    assert len(saved) == 6 and "timeline" in saved and "pipeline" not in saved
    assert not (tmp_path / "lazy").exists() and "drawn: []" in repr(saved)  # named, not drawn yet
    assert saved["timeline"] is saved["timeline"]  # drawn once
    assert sorted(p.name for p in (tmp_path / "lazy").iterdir()) == ["timeline.png"]  # PNG only, what was asked
    assert set(dict(saved)) == set(figures) and len(list((tmp_path / "lazy").glob("*.png"))) == 6


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


def test_run_figures_titles_name_the_run_by_its_label(tmp_path):
    """A run of M7 with cp as its shard dim is "M7+CP" in its notebook: the figures say so too."""
    metrics = {"recipe": "M7", "degrees": {"world_size": 4, "dp_replicate": 2, "dp_shard": 1, "cp": 2}}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    titles = {
        name: fig._suptitle.get_text() if fig._suptitle else " ".join(ax.get_title() for ax in fig.axes)
        for name, fig in run_figures(tmp_path, label="M7+CP").items()
    }
    assert titles and all("M7+CP" in text for text in titles.values()), titles


def test_a_figure_is_rendered_once_and_again_after_an_edit():
    """Display, saved PNG and report share one render (png_bytes); an edit marks the figure stale."""
    from hyper_parallel.viz import png_bytes

    fig = mesh_map(ParallelDims(world_size=2, dp_shard=2))
    first = png_bytes(fig)
    assert png_bytes(fig) is first and first[:8] == b"\x89PNG\r\n\x1a\n"
    fig.axes[0].set_title("edited")
    again = png_bytes(fig)
    assert again is not first and again != first
    assert png_bytes(fig, dpi=50) != again  # another resolution is another render


def test_numerics_compared_draws_each_runs_difference_per_step():
    """10_pure_tp_fix's two runs in one figure: a bar per run and step at |loss - reference| (an exact 0 at
    the floor), the parameters' difference in the legend."""
    from hyper_parallel.viz import numerics_compared

    wrong = {"losses": [2.0, 1.5003], "reference_losses": [2.0, 1.5], "max_param_diff": 2e-3}
    right = {"losses": [2.0, 1.5 + 1e-8], "reference_losses": [2.0, 1.5], "max_param_diff": 0.0}
    fig = numerics_compared({"without fix": wrong, "with fix": right})
    ax = fig.axes[0]
    heights = {
        label: [p.get_height() for p in ax.patches if p.get_gid() == f"run:{label}"]
        for label in ("without fix", "with fix")
    }
    assert heights["without fix"] == pytest.approx([1e-12, 3e-4], rel=1e-3)
    assert heights["with fix"] == pytest.approx([1e-12, 1e-8], rel=1e-3)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [
        "without fix (params after the last step: 2.0e-03)",
        "with fix (params after the last step: 0.0e+00)",
    ]
    with pytest.raises(ValueError, match="losses"):
        numerics_compared({"empty": {}})
