"""The mesh widget in-process (no kernel, no browser): choices, live validation, preview, Launch wiring.

No worker is started here: ``launch.runs.torchrun`` is replaced by a function that fails the test,
and the Launch tests inject a fake runner that writes a tiny run directory.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from hyper_parallel.mesh import ParallelDims, valid_choices
from hyper_parallel.recipes import registry
from hyper_parallel.run_files import METRICS_FILE, PROGRESS_PREFIX
from launch import runs as launch_runs
from launch.notebook.widgets import DEGREES, MeshWidget, Stopped, cli_command, recipe_card, valid_meshes


@pytest.fixture(autouse=True)
def no_workers(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a widget test tried to start torchrun workers")

    monkeypatch.setattr(launch_runs, "torchrun_claimed", refuse)  # a fresh launch
    monkeypatch.setattr(launch_runs, "_run_on_pool", refuse)  # the warm pool


def title(widget: MeshWidget) -> str:
    return widget.preview_figure._suptitle.get_text().splitlines()[0]


def test_default_selection_is_the_recipe_default_and_valid():
    widget = MeshWidget("M7")
    assert widget.recipe == "M7"
    assert widget.degrees == dict(world_size=4, dp_replicate=2, dp_shard=2, cp=1, ulysses=1, tp=1, ep=1, etp=1)
    assert widget.valid and widget.error is None and not widget.launch_button.disabled
    assert "✔ valid" in widget.status.value and widget.fix_button.layout.display == "none"
    assert "M7" in title(widget) and "dp_replicate 2" in title(widget)
    assert bytes(widget.preview.value).startswith(b"\x89PNG")
    assert launch_runs.validate(widget.recipe, **widget.degrees)[1].world_size == 4  # notebooks rebind with it


def test_selectors_offer_only_values_of_valid_meshes_for_the_world_size_and_recipe():
    for recipe in ("M4", "M2", "M6", "S1", "S2", "C-MoE"):
        widget = MeshWidget(recipe, preview=False)
        spec = registry.get(recipe)
        for world in widget.world_selector.options:
            widget.world_selector.value = world
            assert widget.valid, (recipe, world, widget.error)  # a world-size change lands on a valid mesh
            meshes = valid_meshes(recipe, world)
            assert meshes, (recipe, world)
            for dims in meshes:  # the helper agrees with valid_choices + Recipe.validate
                assert dims in valid_choices(world)
                spec.validate(**{k: v for k, v in dims.degrees().items() if k != "pp"})
            for name in DEGREES:
                offered = {value for _, value in widget.selectors[name].options}
                assert offered == {getattr(d, name) for d in meshes}, (recipe, world, name)
    m4 = MeshWidget("M4", world_size=4, dp_shard=4, preview=False)
    assert [v for _, v in m4.selectors["dp_shard"].options] == [4]  # FSDP only: no other choice on 4 ranks
    assert [v for _, v in m4.selectors["tp"].options] == [1]
    # every dp_shard > 1 runs: where 16 rows do not split evenly, the global batch adapts (18 on 3 ranks)
    assert set(m4.world_selector.options) == set(range(2, 9))


@pytest.mark.parametrize(
    "recipe, world, offered",
    [
        ("M5-R", 4, {"cp": {2, 4}, "ulysses": {1}}),  # a ring needs 2 ranks; 16 tokens cut into 2 x 4 chunks
        ("M5-UR", 4, {"cp": {2}, "ulysses": {2}}),
        ("M5-UR", 8, {"cp": {2, 4}, "ulysses": {2, 4}}),  # 4 heads split over ulysses 4; 16 tokens over 2*2*4
        ("P5", 8, {"pp": {2, 4}}),  # 8 layers in 2 pp stages: pp 2 or 4 (an odd pp does not split them)
    ],
)
def test_sequence_and_schedule_selectors_offer_only_valid_values(recipe, world, offered):
    """The selectors offer the values of valid meshes only (by hand, the rules of tests/test_bad_input.py):
    no ring of one rank, a ulysses degree only where the recipe has one and it divides heads and tokens."""
    widget = MeshWidget(recipe, world_size=world, preview=False, dp_shard=-1, **{k: min(v) for k, v in offered.items()})
    assert widget.valid, widget.error
    for name, values in offered.items():
        assert {value for _, value in widget.selectors[name].options} == values, name


def test_invalid_degree_explains_the_rule_and_disables_launch_then_a_valid_one_re_enables_it():
    widget = MeshWidget("M2", world_size=4, dp_shard=2, tp=2)
    before_title, before_axes, before_png = title(widget), len(widget.preview_figure.axes), widget.preview.value
    assert widget.valid and not widget.launch_button.disabled
    assert before_title.endswith("dp_shard 2 × tp 2") and before_axes == 2

    widget.selectors["tp"].value = 4  # 2 * 4 != 4 ranks
    assert not widget.valid and widget.dims is None
    assert widget.error.startswith("world-size equation violated") and "!= world_size=4" in widget.error
    assert "✘ invalid" in widget.status.value and "world-size equation violated" in widget.status.value
    assert widget.launch_button.disabled
    assert widget.launch() is None and widget.thread is None  # Launch refuses while invalid
    assert widget.fix_button.layout.display == "" and widget.fix_button.description == "use dp_shard=1"
    assert "last valid choice" in widget.preview_caption.value
    assert title(widget) == before_title  # the preview still shows the last valid mesh

    widget.selectors["dp_shard"].value = 1  # tp=4 on 4 ranks: valid again
    assert widget.valid and widget.error is None and not widget.launch_button.disabled
    assert title(widget) != before_title and title(widget).endswith("tp 4")
    assert len(widget.preview_figure.axes) == 1 and bytes(widget.preview.value) != bytes(before_png)
    assert widget.degrees["tp"] == 4 and widget.degrees["dp_shard"] == 1


def test_nearest_valid_choice_keeps_the_changed_degree_and_can_be_applied():
    widget = MeshWidget("C-MoE", preview=False)  # 8 ranks: dp_shard 2, cp 2, tp 2, ep 2, etp 2
    widget.selectors["etp"].value = 1  # etp == 1: ep must be a multiple of cp*tp = 4
    assert not widget.valid and "ep=2 does not fit the mesh" in widget.error and "cp*tp=4" in widget.error
    assert widget.launch_button.disabled
    widget.apply_suggestion()
    assert widget.valid and widget.degrees["etp"] == 1 and widget.degrees["ep"] == 4


def test_invalid_start_values_are_shown_marked_and_explained():
    widget = MeshWidget("S2", world_size=4, dp_shard=2, tp=2, ep=2, etp=4, preview=False)
    assert not widget.valid and widget.launch_button.disabled
    assert widget.error == "with ep=2, etp must be 1 or equal to tp=2; got etp=4"
    assert ("4 (no valid mesh)", 4) in widget.selectors["etp"].options
    with pytest.raises(ValueError, match="unknown recipe"):
        MeshWidget("M9")


def test_recipe_and_world_size_changes_keep_the_selection_valid():
    widget = MeshWidget("M1", recipes=["M1", "M4"], preview=False)
    assert widget.recipe_selector.layout.display == ""
    widget.recipe_selector.value = "M4"
    assert widget.recipe == "M4" and widget.valid and widget.degrees["dp_shard"] == 2
    assert "FSDP only" in widget.header.value
    widget.world_selector.value = 8
    assert widget.valid and widget.degrees["world_size"] == 8 and widget.degrees["dp_shard"] == 8
    widget.set(world_size=2, dp_shard=2)
    assert widget.valid and widget.degrees["world_size"] == 2
    with pytest.raises(ValueError, match="unknown degree"):
        widget.set(vp=2)


def fitting_microbatches(global_batch: int, dp: int, stages: int) -> list[int]:
    rows = global_batch // dp
    return [m for m in range(1, rows + 1) if rows % m == 0 and m >= stages]


def test_microbatch_selector_offers_only_the_counts_that_fit_the_mesh():
    batch = registry.get("P1").shapes["global_batch"]
    widget = MeshWidget("P1", recipes=["P1", "P1-I", "M4"], preview=False, world_size=8, pp=2, dp_shard=4)
    assert widget.valid and list(widget.microbatches_selector.options) == fitting_microbatches(batch, 4, 2) == [2]
    assert widget.options == {"microbatches": 2}  # the default 4 does not fit: the nearest that does
    assert "--microbatches 2" in widget.status.value
    widget.set(world_size=4, dp_shard=2)
    assert list(widget.microbatches_selector.options) == fitting_microbatches(batch, 2, 2) == [2, 4]
    assert widget.options == {"microbatches": 2}  # the pick still fits: kept
    widget.microbatches_selector.value = 4
    assert widget.options == {"microbatches": 4} and "--microbatches 4" in widget.status.value
    widget.recipe_selector.value = "P1-I"  # 4 stages on 2 dp ranks of 4 rows
    assert list(widget.microbatches_selector.options) == fitting_microbatches(batch, 2, 4) == [4]
    widget.recipe_selector.value = "M4"  # no pipeline: no selector, no option
    assert widget.microbatches_selector.layout.display == "none" and widget.options == {}


def test_a_widget_run_without_out_goes_to_the_scratch_folder(tmp_path, monkeypatch):
    """As every launch without out= (docs/cli.md, "Scratch is bounded"): a fresh folder under the private
    scratch root, which later launches prune."""
    from launch.processes.run_dirs import SCRATCH_ENV

    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    monkeypatch.setenv(SCRATCH_ENV, str(scratch))
    calls = []
    widget = MeshWidget("M4", steps=1, preview=False, runner=fake_runner(calls))
    widget.launch()
    widget.wait(timeout=60)
    assert calls[0].out.parent == scratch and calls[0].out.name.startswith("hp-M4-")


def test_launch_passes_the_picked_microbatches(tmp_path):
    calls = []
    widget = MeshWidget("P1", steps=1, microbatches=2, out=tmp_path, preview=False, runner=fake_runner(calls))
    widget.launch()
    widget.wait(timeout=60)
    assert calls[0].options.microbatches == 2 and calls[0].dims.pp == 2


def test_cli_command_and_recipe_card():
    assert (
        cli_command(
            "M6", {"world_size": 8, "dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2, "ep": 1, "etp": 1}, steps=2
        )
        == "python -m launch run M6 --world 8 --dp-shard 2 --cp 2 --tp 2 --steps 2"
    )
    card = recipe_card("S2").data
    assert "S2" in card and "ep&gt;1" in card and "python -m launch run S2" in card


class FakeResult:
    """What the widget reads of a launch.RunResult."""

    def __init__(self, run_dir: Path, ok: bool = True) -> None:
        self.run_dir, self.ok = run_dir, ok
        self.error = None if ok else "result differs from the single-process reference"

    def summary(self) -> dict:
        return {"max_abs_diff": 1e-7, "max_param_diff": 2e-8, "duration": 0.1}


def fake_runner(calls: list):
    """Stands in for launch.runs.run_spec: streams lines and progress, writes metrics.json, starts nothing."""

    def run(spec, *, timeout, on_line, on_progress):
        calls.append(spec)
        out, steps = spec.out, spec.steps
        out.mkdir(parents=True, exist_ok=True)
        losses = [1.0 - 0.1 * step for step in range(steps)]
        for rank in range(spec.dims.world_size):
            on_line(rank, f"rank {rank} ready")
        for step in range(steps):
            progress = {"step": step + 1, "steps": steps, "loss": losses[step], "reference": losses[step]}
            on_line(0, PROGRESS_PREFIX + json.dumps(progress))
            on_progress(progress)
        (out / METRICS_FILE).write_text(
            json.dumps(
                {
                    "recipe": spec.recipe,
                    "degrees": spec.dims.degrees(),
                    "losses": losses,
                    "reference_losses": losses,
                    "max_abs_diff": 0.0,
                    "ok": True,
                }
            )
        )
        return FakeResult(out)

    return run


def test_launch_runs_in_a_thread_with_progress_logs_and_figures(tmp_path):
    calls = []
    widget = MeshWidget(
        "M4", steps=3, out=tmp_path / "runs", figures_dir=tmp_path / "figures", runner=fake_runner(calls)
    )
    thread = widget.launch()
    assert isinstance(thread, threading.Thread)
    result = widget.wait(timeout=60)
    assert not widget.running and result is not None and result.ok
    assert [(spec.recipe, spec.steps, spec.dims) for spec in calls] == [("M4", 3, ParallelDims(**widget.degrees))]
    assert calls[0].out.parent == tmp_path / "runs"
    assert widget.progress.value == 3 and widget.progress.max == 3 and widget.progress.bar_style == "success"
    logged = "".join(output["text"] for output in widget.log_output.outputs)
    assert "[rank0] rank 0 ready" in logged and "[rank1] rank 1 ready" in logged
    assert PROGRESS_PREFIX not in logged  # progress lines drive the bar, not the log
    assert "matched its single-process reference" in widget.run_status.value
    assert list(widget.figures) == ["mesh", "numerics"]  # no traces in the fake run
    assert widget.figure_tabs.titles == ("mesh", "numerics") and widget.figure_tabs.layout.display == ""
    assert (tmp_path / "figures" / calls[0].out.name / "numerics.png").exists()
    assert not widget.launch_button.disabled and widget.stop_button.disabled
    assert not widget.world_selector.disabled


def test_stop_ends_the_run_at_the_next_line_and_errors_are_shown():
    started = threading.Event()

    def endless(spec, *, on_line, **kwargs):
        started.set()
        while True:  # like torchrun streaming lines; on_line raises once Stop was clicked
            on_line(0, "working")

    widget = MeshWidget("M4", preview=False, runner=endless)
    widget.launch()
    assert started.wait(30) and widget.running
    assert widget.launch_button.disabled and widget.world_selector.disabled and not widget.stop_button.disabled
    widget.stop()
    widget.wait(timeout=30)
    assert not widget.running and widget.result is None and widget.run_error == "stopped by the user"
    assert not widget.launch_button.disabled

    def broken(spec, **kwargs):
        raise RuntimeError("no free port")

    widget = MeshWidget("M4", preview=False, runner=broken)
    widget.launch()
    widget.wait(timeout=30)
    assert widget.run_error == "RuntimeError: no free port" and "could not run" in widget.run_status.value
    assert issubclass(Stopped, Exception)


def test_export_report_writes_the_finished_runs_report_next_to_it(tmp_path):
    from launch.report import REPORT_FILE

    calls = []
    widget = MeshWidget("M4", steps=2, out=tmp_path / "runs", runner=fake_runner(calls))
    assert widget.export_button.disabled and widget.export_report() is None  # nothing finished yet
    widget.launch()
    widget.wait(timeout=60)
    assert not widget.export_button.disabled
    widget.export_button.click()
    report = calls[0].out.resolve() / REPORT_FILE
    assert widget.report_path == report and report.exists()
    assert str(report) in widget.report_status.value.replace("&#x27;", "'")
    text = report.read_text()
    assert [f"data-figure='{name}'" in text for name in widget.figures] == [True, True]  # the widget's figures
    assert "data-ok='true'" in text

    def failing(spec, **kwargs):
        out = spec.out
        out.mkdir(parents=True, exist_ok=True)
        degrees = spec.dims.degrees()
        (out / "summary.json").write_text(
            json.dumps(
                {
                    "recipe": spec.recipe,
                    "degrees": degrees,
                    "ok": False,
                    "error": "rank 1 failed: <boom>",
                    "returncode": 1,
                }
            )
        )
        result = FakeResult(out, ok=False)
        result.logs = {-1: ["torchrun gave up"], 0: ["fine"], 1: ["<script>boom()</script>"]}
        return result

    widget = MeshWidget("M4", preview=False, out=tmp_path / "failing", runner=failing)
    widget.launch()
    widget.wait(timeout=60)
    assert "failed" in widget.run_status.value and not widget.export_button.disabled
    text = widget.export_report().read_text()  # a failed run is reported too, with the in-memory logs
    assert "data-ok='false'" in text and "rank 1 failed: &lt;boom&gt;" in text
    assert "torchrun gave up" in text and "&lt;script&gt;boom()&lt;/script&gt;" in text and "<script>boom" not in text


def test_bench_widget_offers_only_the_configurations_of_its_world_size_and_runs_them():
    from launch.notebook.widgets import BenchWidget

    calls = []

    class Finished:
        ok, error, rows = False, "workers not started in this test", []

    def runner(world, **options):
        calls.append((world, options["steps"], options["configs"]))
        return Finished()

    widget = BenchWidget(world_size=4, steps=3, runner=runner)
    assert widget.configs.options == ("FSDP", "HSDP", "FSDP+TP", "S2", "TP+SP", "AsyncTP")
    assert widget.configs.value == ("FSDP", "HSDP", "FSDP+TP", "S2")  # TP+SP and async TP only when picked
    widget.world.value = 2
    assert widget.configs.options == ("FSDP", "TP+SP", "AsyncTP") and widget.configs.value == ("FSDP",)
    widget.launch()
    widget.wait(10)
    assert calls == [(2, 3, ["FSDP"])]
    assert "workers not started in this test" in widget.status.value and not widget.run_button.disabled


def test_launch_passes_the_picked_link(tmp_path):
    """The link picker offers no link and every preset; the run record carries the one picked."""
    from hyper_parallel.link import LINK_PRESETS

    calls = []
    widget = MeshWidget("M4", steps=1, out=tmp_path, preview=False, runner=fake_runner(calls))
    assert list(widget.link_selector.options) == ["none", *LINK_PRESETS] and widget.link_selector.value == "none"
    widget.launch()
    widget.wait(timeout=60)
    widget.link_selector.value = "notebook"
    widget.launch()
    widget.wait(timeout=60)
    assert [call.link for call in calls] == [None, LINK_PRESETS["notebook"]]
    with pytest.raises(ValueError, match="preset"):
        MeshWidget("M4", preview=False, link="warp")
