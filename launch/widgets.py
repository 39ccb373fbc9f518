"""Widgets and small displays for the notebooks: pick mesh degrees, see the mesh, launch a run.

    picker = MeshWidget("M4", world_size=2, dp_shard=2)   # display it as the last line of a cell
    picker.degrees      # {"world_size": 2, "dp_replicate": 1, "dp_shard": 2, ...}: rebind a notebook's parameters
    picker.valid, picker.error, picker.dims
    picker.launch()     # what the Launch button does: launch.run in a background thread
    picker.wait(); picker.result, picker.figures

The selectors only offer values that occur in at least one valid mesh of the chosen world size and
recipe (``valid_choices`` + ``Recipe.validate``); a combination that breaks a rule is explained with
the rule's own message and the nearest valid choice, and Launch stays disabled until it is fixed.
Nothing here starts a worker until Launch is clicked (or ``launch()`` called); papermill never
clicks, so notebooks run their default configuration in a plain code cell instead.

Workers are started by ``launch.run`` (a ``torchrun`` subprocess whose output is read line by line),
never by forking the kernel; their lines go to an ``Output`` widget, their progress to a bar.
"""
from __future__ import annotations

import datetime
import html
import io
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import ipywidgets as widgets

from hyper_parallel.mesh import ParallelDims, valid_choices
from hyper_parallel.recipes import registry
from hyper_parallel.run_files import PROGRESS_PREFIX

DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "ep", "etp")
HELP = {
    "world_size": "number of ranks (worker processes)",
    "dp_replicate": "replica groups: gradients all-reduced across them (HSDP's outer dim)",
    "dp_shard": "ranks that shard parameters (FSDP)",
    "cp": "context parallel: the sequence is split over these ranks",
    "tp": "tensor parallel: weights are split over these ranks (innermost, contiguous)",
    "ep": "expert parallel: experts spread over these ranks (borrowed, not a factor of world_size)",
    "etp": "expert tensor parallel: each expert's hidden dim split (1 or tp)",
}
LOG_FLUSH_SECONDS = 0.3
MAX_LOG_LINES = 3000
_OK, _BAD, _INFO = "#1a7f37", "#cf222e", "#57606a"


class Stopped(Exception):
    """Raised from the line callback when Stop was clicked: ``launch`` then ends torchrun and its workers."""


def _png(fig, dpi: int = 90) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def _degrees_text(degrees: dict[str, int]) -> str:
    shown = [f"{k}={v}" for k, v in degrees.items() if k != "world_size" and v != 1]
    return f"world_size={degrees['world_size']}" + (": " + ", ".join(shown) if shown else "")


def cli_command(recipe: str, degrees: dict[str, int], steps: int | None = None) -> str:
    """The ``python -m launch run`` line doing the same run from a terminal."""
    parts = ["python -m launch run", recipe, f"--world {degrees['world_size']}"]
    parts += [f"--{k.replace('_', '-')} {v}" for k, v in degrees.items() if k != "world_size" and v != 1]
    if steps is not None:
        parts.append(f"--steps {steps}")
    return " ".join(parts)


def valid_meshes(recipe: str, world_size: int) -> list[ParallelDims]:
    """Every mesh of ``world_size`` ranks that ``recipe`` accepts (its constraints and shapes included)."""
    spec = registry.get(recipe)
    meshes = []
    for dims in valid_choices(world_size):
        try:
            meshes.append(spec.validate(**{k: v for k, v in dims.degrees().items() if k != "pp"}))
        except ValueError:
            continue
    return meshes


def _differences(dims: ParallelDims, wanted: dict[str, int]) -> int:
    return sum(getattr(dims, name) != value for name, value in wanted.items())


class MeshWidget(widgets.VBox):
    """Degree selectors, live validation, a mesh-map preview and a Launch button for one recipe.

    ``recipe``: the recipe to run (``recipes``: others offered in a drop-down, e.g. a notebook's
    family); ``world_size`` and the degrees start the selection (default: the recipe's default run);
    ``steps``, ``timeout``, ``out`` (parent folder of the run directories; default: temporary) and
    ``figures_dir`` (where the figures of a finished run are saved) are used by Launch.
    ``runner`` replaces ``launch.run`` (tests). ``max_world_size`` bounds the world-size choices.
    """

    def __init__(self, recipe: str = "M4", *, recipes: tuple[str, ...] | list[str] | None = None,
                 steps: int | None = None, timeout: float = 300.0, out: str | Path | None = None,
                 figures_dir: str | Path | None = None, max_world_size: int = 8, preview: bool = True,
                 runner: Callable[..., Any] | None = None, **degrees: int) -> None:
        spec = registry.get(recipe)
        names = [registry.get(name).name for name in (recipes or [spec.name])]
        if spec.name not in names:
            names.insert(0, spec.name)
        self.timeout, self.max_world_size, self.preview_enabled = timeout, max_world_size, preview
        self.out = Path(out) if out is not None else None
        self.figures_dir = Path(figures_dir) if figures_dir is not None else None
        self._runner = runner
        self._updating = False
        self._last_changed: str | None = None
        self._suggestion: dict[str, int] | None = None
        self._valid_cache: dict[tuple[str, int], list[ParallelDims]] = {}
        self._stop = threading.Event()
        self._log_lock = threading.Lock()
        self._log_buffer: list[str] = []
        self._log_count = 0
        self._last_flush = 0.0
        self.thread: threading.Thread | None = None
        self.result = None
        self.run_error: str | None = None
        self.figures: dict[str, Any] = {}
        self.preview_figure = None
        self._preview_key = None
        self.dims: ParallelDims | None = None
        self.error: str | None = None

        style = {"description_width": "initial"}
        self.header = widgets.HTML()
        self.recipe_selector = widgets.Dropdown(options=names, value=spec.name, description="recipe",
                                                layout=widgets.Layout(width="210px", display="" if len(names) > 1 else "none"))
        self.world_selector = widgets.Dropdown(description="world_size", style=style,
                                               layout=widgets.Layout(width="150px"), tooltip=HELP["world_size"])
        self.steps_selector = widgets.BoundedIntText(value=steps or spec.steps, min=1, max=50, description="steps",
                                                     layout=widgets.Layout(width="130px"))
        self.selectors = {name: widgets.Dropdown(description=name, style=style, tooltip=HELP[name],
                                                 layout=widgets.Layout(width="150px")) for name in DEGREES}
        self.status = widgets.HTML()
        self.fix_button = widgets.Button(description="use the nearest valid choice", icon="wrench",
                                         layout=widgets.Layout(width="fit-content", display="none"))
        self.preview = widgets.Image(format="png", layout=widgets.Layout(max_width="100%", display="none"))  # until drawn
        self.preview_caption = widgets.HTML()
        self.launch_button = widgets.Button(description="Launch", button_style="success", icon="play",
                                            tooltip="start torchrun workers with these degrees")
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop", disabled=True,
                                          tooltip="end torchrun and every worker (at their next output line)")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="steps", bar_style="",
                                            layout=widgets.Layout(width="320px"))
        self.run_status = widgets.HTML()
        self.log_output = widgets.Output(layout=widgets.Layout(max_height="260px", overflow="auto", border="1px solid #ddd"))
        self.log_box = widgets.Accordion(children=[self.log_output], titles=("worker output",), selected_index=None)
        self.figure_tabs = widgets.Tab(layout=widgets.Layout(display="none"))

        self.recipe_selector.observe(self._on_recipe, names="value")
        self.world_selector.observe(self._on_world, names="value")
        for name, selector in self.selectors.items():
            selector.observe(lambda change, name=name: self._on_degree(name, change), names="value")
        self.steps_selector.observe(lambda change: self._refresh(), names="value")
        self.fix_button.on_click(lambda _: self.apply_suggestion())
        self.launch_button.on_click(lambda _: self.launch())
        self.stop_button.on_click(lambda _: self.stop())

        super().__init__(children=[
            self.header,
            widgets.HBox([self.recipe_selector, self.world_selector, self.steps_selector]),
            widgets.HBox([self.selectors[name] for name in DEGREES[:3]]),
            widgets.HBox([self.selectors[name] for name in DEGREES[3:]]),
            self.status, self.fix_button,
            self.preview_caption, self.preview,
            widgets.HBox([self.launch_button, self.stop_button, self.progress]),
            self.run_status, self.log_box, self.figure_tabs,
        ])
        from launch.runner import resolve_degrees  # what launch.run does: world_size from the degrees if omitted
        self._load(spec.name, resolve_degrees(spec, degrees))

    # ------------------------------------------------------------------ public API
    @property
    def recipe(self) -> str:
        return self.recipe_selector.value

    @property
    def spec(self) -> registry.Recipe:
        return registry.get(self.recipe)

    @property
    def world_size(self) -> int:
        return self.world_selector.value

    @property
    def degrees(self) -> dict[str, int]:
        """The current selection, ``world_size`` first: pass it to ``launch.run(recipe, **degrees)``."""
        return {"world_size": self.world_size, **{name: self.selectors[name].value for name in DEGREES}}

    @property
    def steps(self) -> int:
        return self.steps_selector.value

    @property
    def valid(self) -> bool:
        return self.error is None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def choices(self, world_size: int | None = None) -> list[ParallelDims]:
        """The valid meshes of the current recipe on ``world_size`` ranks (default: the selected one)."""
        key = (self.recipe, world_size or self.world_size)
        if key not in self._valid_cache:
            self._valid_cache[key] = valid_meshes(*key)
        return self._valid_cache[key]

    def set(self, **degrees: int) -> None:
        """Select ``world_size`` and/or degrees at once (values no valid mesh uses are allowed and explained)."""
        unknown = set(degrees) - {"world_size", *DEGREES}
        if unknown:
            raise ValueError(f"unknown degree(s) {sorted(unknown)}; known: {['world_size', *DEGREES]}")
        merged = {**self.degrees, **degrees}
        self._last_changed = next((name for name in DEGREES if name in degrees), None)
        self._load(self.recipe, merged)

    def apply_suggestion(self) -> None:
        if self._suggestion:
            self.set(**self._suggestion)

    def launch(self) -> threading.Thread | None:
        """Run the current selection with ``launch.run`` in a background thread (no-op while invalid or running)."""
        if not self.valid or self.running:
            return None
        recipe, degrees, steps = self.recipe, self.degrees, self.steps
        self._stop.clear()
        self.result, self.run_error, self.figures = None, None, {}
        self.log_output.clear_output()
        self._log_count = 0
        self.figure_tabs.children = ()
        self.figure_tabs.layout.display = "none"
        self.progress.max, self.progress.value, self.progress.bar_style = steps, 0, "info"
        self.progress.description = "steps"
        self._set_running(True)
        self._say(f"starting {degrees['world_size']} worker(s) for {recipe} ({_degrees_text(degrees)}); importing "
                  "torch and the rendezvous take 10-20 s on a small machine …", _INFO)
        self.thread = threading.Thread(target=self._run, args=(recipe, degrees, steps), daemon=True,
                                       name=f"MeshWidget-{recipe}")
        self.thread.start()
        return self.thread

    def stop(self) -> None:
        """Ask the running launch to end: torchrun and its workers are ended at the next output line."""
        if self.running:
            self._stop.set()
            self._say("stopping: torchrun and its workers are ended at their next output line …", _INFO)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the launched run finished; return its result (None if it failed to run)."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.result

    # ------------------------------------------------------------------ selection
    def _load(self, recipe: str, wanted: dict[str, int]) -> None:
        """Set recipe, world-size options, degree options and values from ``wanted``; then refresh."""
        self._updating = True
        try:
            if self.recipe_selector.value != recipe:
                self.recipe_selector.value = recipe
            spec = registry.get(recipe)
            worlds = [w for w in range(1, self.max_world_size + 1) if self.choices(w)]
            world = wanted.get("world_size") or spec.default["world_size"]
            self.world_selector.options = sorted(set(worlds) | {world})
            self.world_selector.value = world
            values = {name: wanted.get(name, 1) for name in DEGREES}
            if values["dp_shard"] in (None, -1):  # "infer", as ParallelDims does
                others = values["dp_replicate"] * values["cp"] * values["tp"]
                values["dp_shard"] = world // others if others and world % others == 0 else 1
            offered = self._offered(world)
            for name in DEGREES:
                selector = self.selectors[name]
                options = sorted(offered[name] | {values[name]})
                selector.options = [(str(v) if v in offered[name] else f"{v} (no valid mesh)", v) for v in options]
                selector.value = values[name]
        finally:
            self._updating = False
        self._refresh()

    def _offered(self, world: int) -> dict[str, set[int]]:
        valid = self.choices(world)
        return {name: {getattr(dims, name) for dims in valid} for name in DEGREES}

    def _nearest(self, wanted: dict[str, int], world: int, keep: str | None = None) -> ParallelDims | None:
        """The valid mesh of ``world`` ranks differing from ``wanted`` in the fewest degrees
        (keeping ``keep`` at its value when some valid mesh allows it)."""
        valid = self.choices(world)
        if keep is not None and any(getattr(d, keep) == wanted[keep] for d in valid):
            valid = [d for d in valid if getattr(d, keep) == wanted[keep]]
        if not valid:
            return None
        default = self.spec.default
        # fewest changed degrees; then prefer not to switch off a parallelism that is on; then the recipe default
        return min(valid, key=lambda d: (_differences(d, wanted),
                                         sum(getattr(d, k) == 1 < wanted[k] for k in DEGREES),
                                         _differences(d, {k: default.get(k, 1) for k in DEGREES})))

    def _on_recipe(self, change) -> None:
        if self._updating:
            return
        spec = registry.get(change["new"])
        self._last_changed = None
        self._load(spec.name, dict(spec.default))

    def _on_world(self, change) -> None:
        if self._updating:
            return
        world = change["new"]
        current = {name: self.selectors[name].value for name in DEGREES}
        nearest = self._nearest(current, world)
        self._last_changed = None
        self._load(self.recipe, {"world_size": world, **(nearest.degrees() if nearest else current)})

    def _on_degree(self, name: str, change) -> None:
        if self._updating:
            return
        self._last_changed = name
        self._refresh()

    def _refresh(self) -> None:
        """Validate the selection; update the explanation, Launch, the suggestion and the preview."""
        degrees = self.degrees
        try:
            dims = self.spec.validate(**degrees)
        except ValueError as error:
            self.dims, self.error = None, str(error)
        else:
            self.dims, self.error = dims, None
        self._suggestion = None
        if self.error is None:
            note = ""
            if degrees["world_size"] > (os.cpu_count() or 1):
                note = (f"<br><span style='color:{_INFO}'>{degrees['world_size']} ranks on {os.cpu_count()} cores: "
                        "works (gloo on CPU), just slower</span>")
            views = "\n".join(html.escape(line.strip()) for line in self.dims.describe().splitlines()[1:])
            self.status.value = (f"<div style='color:{_OK}'><b>✔ valid</b>: {html.escape(_degrees_text(degrees))}"
                                 f"<pre style='margin:2px 0;font-size:85%;line-height:1.25;color:{_OK}'>{views}</pre>"
                                 f"same run from a terminal: "
                                 f"<code>{html.escape(cli_command(self.recipe, degrees, self.steps))}</code>{note}</div>")
            self.fix_button.layout.display = "none"
            self._update_preview()
        else:
            nearest = self._nearest(degrees, degrees["world_size"], keep=self._last_changed)
            hint = ""
            if nearest is not None:
                changes = {k: getattr(nearest, k) for k in DEGREES if getattr(nearest, k) != degrees[k]}
                self._suggestion = changes
                hint = ("<br>nearest valid choice: <b>" + html.escape(", ".join(f"{k}={v}" for k, v in changes.items()))
                        + "</b>")
                self.fix_button.description = "use " + ", ".join(f"{k}={v}" for k, v in changes.items())
                self.fix_button.layout.display = ""
            else:
                self.fix_button.layout.display = "none"
            self.status.value = (f"<div style='color:{_BAD}'><b>✘ invalid</b>: {html.escape(self.error)}{hint}"
                                 "<br><i>Launch is disabled until the degrees are valid.</i></div>")
            if self.preview_figure is not None:
                self.preview_caption.value = (f"<span style='color:{_INFO}'>mesh map of the last valid choice "
                                              "(the current one is invalid)</span>")
        self.header.value = self._header()
        self._set_running(self.running)

    def _header(self) -> str:
        spec = self.spec
        constraints = spec.constraints() or "none beyond the mesh rules"
        return (f"<b>{html.escape(spec.name)} — {html.escape(spec.title)}</b><br>"
                f"<span style='font-size:90%'>{html.escape(spec.description)}<br>recipe constraints: "
                f"<code>{html.escape(constraints)}</code>; default run: "
                f"<code>{html.escape(_degrees_text(spec.default))}</code></span>")

    def _update_preview(self) -> None:
        if not self.preview_enabled or self.dims is None:
            return
        if self.preview_figure is not None and self._preview_key == (self.recipe, self.dims):
            self.preview_caption.value = f"<b>mesh map</b> of {html.escape(_degrees_text(self.degrees))}"
            return
        from hyper_parallel.viz import mesh_map
        self._preview_key = (self.recipe, self.dims)
        self.preview_figure = mesh_map(self.dims, self.recipe)
        self.preview.value = _png(self.preview_figure, dpi=80)
        self.preview.layout.display = ""
        self.preview_caption.value = f"<b>mesh map</b> of {html.escape(_degrees_text(self.degrees))}"

    def _set_running(self, running: bool) -> None:
        self.launch_button.disabled = running or not self.valid
        self.stop_button.disabled = not running
        for selector in [self.recipe_selector, self.world_selector, self.steps_selector, *self.selectors.values()]:
            selector.disabled = running
        self.fix_button.disabled = running

    # ------------------------------------------------------------------ the run (background thread)
    def _say(self, text: str, color: str) -> None:
        self.run_status.value = f"<span style='color:{color}'>{text}</span>"

    def _on_line(self, rank: int, line: str) -> None:
        if self._stop.is_set():
            raise Stopped("stopped by the user")
        if line.startswith(PROGRESS_PREFIX):
            return
        with self._log_lock:
            self._log_buffer.append(f"[rank{rank}] {line}" if rank >= 0 else line)
        if time.monotonic() - self._last_flush > LOG_FLUSH_SECONDS:
            self._flush_log()

    def _flush_log(self) -> None:
        with self._log_lock:
            lines, self._log_buffer = self._log_buffer, []
            self._last_flush = time.monotonic()
        room = MAX_LOG_LINES - self._log_count
        if lines and room > 0:
            self._log_count += min(len(lines), room)
            text = "\n".join(lines[:room]) + "\n"
            if len(lines) > room:
                text += f"… (more lines in the run directory's torchrun logs)\n"
            self.log_output.append_stdout(text)

    def _on_progress(self, progress: dict) -> None:
        self.progress.max = progress["steps"]
        self.progress.value = progress["step"]
        self._say(f"step {progress['step']}/{progress['steps']}: loss {progress['loss']:.6f}, single-process "
                  f"reference {progress['reference']:.6f}", _INFO)

    def _run(self, recipe: str, degrees: dict[str, int], steps: int) -> None:
        from launch.runner import run
        runner = self._runner or run
        # an explicit folder per run: launch.run's result.run_dir is then the folder holding its files
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = (self.out / f"{recipe}-{stamp}" if self.out is not None
                   else Path(tempfile.mkdtemp(prefix=f"hp-{recipe}-{stamp}-")))
        try:
            result = runner(recipe, steps=steps, timeout=self.timeout, out=run_dir, on_line=self._on_line,
                            on_progress=self._on_progress, **degrees)
        except Stopped:
            self.run_error = "stopped by the user"
            self.progress.bar_style = "warning"
            self._say("stopped: torchrun and its workers were ended", _BAD)
            return
        except Exception as error:  # shown in the widget: a thread's exception would vanish otherwise
            self.run_error = f"{type(error).__name__}: {error}"
            self.progress.bar_style = "danger"
            self._say(f"<b>could not run</b>: {html.escape(self.run_error)}", _BAD)
            return
        finally:
            self._flush_log()
            self._set_running(False)
        self.result = result
        summary = result.summary()
        if result.ok:
            self.progress.bar_style = "success"
            self._say(f"<b>✔ {recipe} matched its single-process reference</b>: max |loss − reference| = "
                      f"{summary['max_abs_diff']:.3g}, max |param − reference| = {summary['max_param_diff']:.3g}, "
                      f"{summary['duration']:.1f} s. Run directory: <code>{html.escape(str(result.run_dir))}</code>",
                      _OK)
        else:
            self.progress.bar_style = "danger"
            self.run_error = result.error
            self._say(f"<b>✘ {recipe} failed</b> (run directory <code>{html.escape(str(result.run_dir))}</code>):"
                      f"<pre style='white-space:pre-wrap'>{html.escape(str(result.error))}</pre>", _BAD)
        self._show_figures(result)

    def _show_figures(self, result) -> None:
        from hyper_parallel.viz import run_figures
        try:
            out_dir = self.figures_dir / Path(result.run_dir).name if self.figures_dir is not None else None
            self.figures = run_figures(result.run_dir, out_dir=out_dir)
        except Exception as error:  # a failed run may have no traces or metrics
            self.run_status.value += f"<br><span style='color:{_INFO}'>no figures: {html.escape(str(error))}</span>"
            return
        self.figure_tabs.children = [widgets.Image(value=_png(fig), format="png",
                                                   layout=widgets.Layout(max_width="100%"))
                                     for fig in self.figures.values()]
        self.figure_tabs.titles = tuple(self.figures)
        self.figure_tabs.layout.display = ""


def recipe_card(name: str):
    """A recipe as an HTML block: title, description, matrix row, constraints, default and other meshes."""
    from IPython.display import HTML
    spec = registry.get(name)
    alternatives = "; ".join(_degrees_text(a) for a in spec.alternatives) or "none"
    rows = [("what", spec.description), ("matrix row (seed 002)", spec.matrix_row),
            ("constraints", spec.constraints() or "none beyond the mesh rules"),
            ("default run", _degrees_text(spec.default)), ("also tested on", alternatives),
            ("CI tier", spec.tier or "-"), ("from a terminal", cli_command(spec.name, spec.default))]
    body = "".join(f"<tr><th style='text-align:left;vertical-align:top;padding-right:1em'>{html.escape(k)}</th>"
                   f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in rows)
    return HTML(f"<h4>{html.escape(spec.name)} — {html.escape(spec.title)}</h4><table>{body}</table>")


def table(header: list[str], rows: list[list[Any]], caption: str | None = None):
    """A small HTML table (notebooks show results without pandas)."""
    from IPython.display import HTML
    head = "".join(f"<th style='text-align:left'>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return HTML(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
