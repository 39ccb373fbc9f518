"""``MeshWidget``: the degree picker plus Launch, Stop, progress, worker logs, figures and Export report.

Workers are started by ``launch.runs.run_spec`` (a ``torchrun`` subprocess whose output is read line by line)
in a background thread, never by forking the kernel; their lines go to an ``Output`` widget, their
progress to a bar. papermill never clicks, so notebooks run their default configuration in a plain
code cell instead. Once a run finished (passed or failed), Export report writes the run's
self-contained HTML report (``launch.report``) next to it: the file people attach to a discussion.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import ipywidgets as widgets

from hyper_parallel.link import LINK_PRESETS
from hyper_parallel.mesh_dims import degrees_label
from hyper_parallel.run_files import PROGRESS_PREFIX
from hyper_parallel.viz.style import png_bytes
from launch.notebook.widgets.display import BAD_COLOR, INFO_COLOR, OK_COLOR, step_text
from launch.notebook.widgets.picker import DegreePicker

LOG_FLUSH_SECONDS = 0.3
MAX_LOG_LINES = 3000


class Stopped(Exception):
    """Raised from the line callback when Stop was clicked: ``launch`` then ends torchrun and its workers."""


def report_link(path: Path) -> str:
    """The report's path, and a link when it lies under the kernel's folder (JupyterLab opens relative links)."""
    shown = f"<code>{html.escape(str(path))}</code>"
    relative = os.path.relpath(path, Path.cwd())
    if relative.startswith(".."):
        return f"report written: {shown}"
    return f"report written: <a href='{html.escape(quote(relative))}' target='_blank'>open it</a> ({shown})"


class MeshWidget(DegreePicker):
    """Degree selectors, live validation, a mesh-map preview, Launch and Export report for one recipe.

    Selection arguments as ``DegreePicker``; ``steps``, ``timeout``, ``out`` (parent folder of the run
    directories; default: a fresh scratch folder, as every launch's: docs/cli.md) and ``figures_dir`` (where the figures of a finished run are
    saved) are used by Launch, and ``link``: the emulated link picked at first ("none" or a preset of
    ``hyper_parallel.link.LINK_PRESETS``; docs/cli.md, Emulated link). ``runner`` replaces
    ``launch.runs.run_spec`` (tests).
    """

    def __init__(
        self,
        recipe: str = "M4",
        *,
        recipes: tuple[str, ...] | list[str] | None = None,
        steps: int | None = None,
        microbatches: int | None = None,
        timeout: float = 300.0,
        out: str | Path | None = None,
        figures_dir: str | Path | None = None,
        max_world_size: int = 8,
        preview: bool = True,
        runner: Callable[..., Any] | None = None,
        link: str = "none",
        **degrees: int,
    ) -> None:
        from launch import inputs  # the same rules as launch.run: refused here, not after Launch made a folder

        self.timeout = inputs.timeout(timeout)
        self.out = inputs.out_dir(out)
        self.figures_dir = Path(figures_dir) if figures_dir is not None else None
        self._runner = runner
        self._busy = False
        self._stop = threading.Event()
        self._log_lock = threading.Lock()
        self._log_buffer: list[str] = []
        self._log_count = 0
        self._last_flush = 0.0
        self.thread: threading.Thread | None = None
        self.result = None
        self.run_error: str | None = None
        self.figures: dict[str, Any] = {}
        self.report_path: Path | None = None

        if link != "none" and link not in LINK_PRESETS:
            raise ValueError(f"link must be 'none' or a preset ({', '.join(LINK_PRESETS)}), got {link!r}")
        self.link_selector = widgets.Dropdown(
            options=["none", *LINK_PRESETS],
            value=link,
            description="link",
            tooltip="an emulated link: every collective completes no earlier than latency + wire bytes / rate",
        )
        self._build_launch_controls()
        super().__init__(
            recipe,
            recipes=recipes,
            steps=steps,
            microbatches=microbatches,
            max_world_size=max_world_size,
            preview=preview,
            **degrees,
        )

    def _build_launch_controls(self) -> None:
        """Launch, Stop and Export with their handlers, the step progress, the run's status lines, the worker
        output and the figure tabs (shown once a run has figures)."""
        self.launch_button = widgets.Button(
            description="Launch",
            button_style="success",
            icon="play",
            tooltip="start torchrun workers with these degrees",
        )
        self.stop_button = widgets.Button(
            description="Stop",
            button_style="danger",
            icon="stop",
            disabled=True,
            tooltip="end torchrun and every worker (at their next output line)",
        )
        self.export_button = widgets.Button(
            description="Export report",
            icon="file",
            disabled=True,
            tooltip="write a self-contained HTML report of the finished run next to it",
        )
        self.progress = widgets.IntProgress(
            value=0, min=0, max=1, description="steps", bar_style="", layout=widgets.Layout(width="320px")
        )
        self.run_status = widgets.HTML()
        self.report_status = widgets.HTML()
        self.log_output = widgets.Output(
            layout=widgets.Layout(max_height="260px", overflow="auto", border="1px solid #ddd")
        )
        self.log_box = widgets.Accordion(children=[self.log_output], titles=("worker output",), selected_index=None)
        self.figure_tabs = widgets.Tab(layout=widgets.Layout(display="none"))
        self.launch_button.on_click(lambda _: self.launch())
        self.stop_button.on_click(lambda _: self.stop())
        self.export_button.on_click(lambda _: self.export_report())

    def _rows(self) -> list[widgets.Widget]:
        return super()._rows() + [
            self.link_selector,
            widgets.HBox([self.launch_button, self.stop_button, self.progress, self.export_button]),
            self.run_status,
            self.report_status,
            self.log_box,
            self.figure_tabs,
        ]

    # ------------------------------------------------------------------ public API
    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def launch(self) -> threading.Thread | None:
        """Run the current selection with ``launch.run`` in a background thread (no-op while invalid or running)."""
        if not self.valid or self.running:
            return None
        recipe, degrees, steps, options = self.recipe, self.degrees, self.steps, self.options
        self._stop.clear()
        self.result, self.run_error, self.figures, self.report_path = None, None, {}, None
        self.log_output.clear_output()
        self._log_count = 0
        self.figure_tabs.children = ()
        self.figure_tabs.layout.display = "none"
        self.report_status.value = ""
        self.progress.max, self.progress.value, self.progress.bar_style = steps, 0, "info"
        self.progress.description = "steps"
        self._set_busy(True)
        self._say(
            f"starting {degrees['world_size']} worker(s) for {recipe} ({degrees_label(degrees, world=True)}); importing "
            "torch and the rendezvous take 10-20 s on a small machine …",
            INFO_COLOR,
        )
        self.thread = threading.Thread(
            target=self._run, args=(recipe, degrees, steps, options), daemon=True, name=f"MeshWidget-{recipe}"
        )
        self.thread.start()
        return self.thread

    def stop(self) -> None:
        """Ask the running launch to end: torchrun and its workers are ended at the next output line."""
        if self.running:
            self._stop.set()
            self._say("stopping: torchrun and its workers are ended at their next output line …", INFO_COLOR)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the launched run finished; return its result (None if it failed to run)."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.result

    def export_report(self) -> Path | None:
        """What Export report does: write ``RUN_DIR/report.html`` of the finished run, show its path and
        a link; None (and the reason shown) when there is no finished run or the report cannot be written."""
        if self.result is None or self._busy:
            self.report_status.value = f"<span style='color:{INFO_COLOR}'>no finished run to report on yet</span>"
            return None
        from launch.report import write_report

        self.report_status.value = f"<span style='color:{INFO_COLOR}'>writing the report …</span>"
        try:
            self.report_path = write_report(
                self.result.run_dir, logs=getattr(self.result, "logs", None), figures=self.figures or None
            )
        except (OSError, ValueError) as error:
            self.report_status.value = (
                f"<span style='color:{BAD_COLOR}'>could not write the report: {html.escape(str(error))}</span>"
            )
            return None
        self.report_status.value = report_link(self.report_path)
        return self.report_path

    # ------------------------------------------------------------------ controls
    def _selection_locked(self) -> bool:
        return self._busy

    def _update_controls(self) -> None:
        super()._update_controls()
        self.launch_button.disabled = self._busy or not self.valid
        self.stop_button.disabled = not self._busy
        self.export_button.disabled = self._busy or self.result is None

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self._update_controls()

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
                text += "… (more lines in the run directory's torchrun logs)\n"
            self.log_output.append_stdout(text)

    def _on_progress(self, progress: dict) -> None:
        self.progress.max = progress["steps"]
        self.progress.value = progress["step"]
        self._say(step_text(progress), INFO_COLOR)

    def _run(self, recipe: str, degrees: dict[str, int], steps: int, options: dict[str, int]) -> None:
        from launch.processes.run_dirs import new_scratch_dir
        from launch.runs import resolve_run, run_spec

        runner = self._runner or run_spec
        # an explicit folder per run: the result's run_dir is then the folder holding its files
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        try:
            link = self.link_selector.value
            spec = resolve_run(
                recipe, steps=steps, link=link, **degrees, **options
            )  # validated before a folder is made
            run_dir = (
                self.out / f"{recipe}-{stamp}" if self.out is not None else new_scratch_dir(f"hp-{recipe}-{stamp}-")
            )
            spec = dataclasses.replace(spec, out=run_dir)
            result = runner(spec, timeout=self.timeout, on_line=self._on_line, on_progress=self._on_progress)
        except Stopped:
            self.run_error = "stopped by the user"
            self.progress.bar_style = "warning"
            self._say("stopped: torchrun and its workers were ended", BAD_COLOR)
            return
        except Exception as error:  # shown in the widget: a thread's exception would vanish otherwise
            self.run_error = f"{type(error).__name__}: {error}"
            self.progress.bar_style = "danger"
            self._say(f"<b>could not run</b>: {html.escape(self.run_error)}", BAD_COLOR)
            return
        finally:
            self._flush_log()
            self._set_busy(False)
        self._show_outcome(recipe, result)
        self._show_figures(result)
        self.result = result  # last: Export report is enabled once the figures it reuses are drawn
        self._update_controls()

    def _show_outcome(self, recipe: str, result) -> None:
        summary = result.summary()
        where = f"Run directory: <code>{html.escape(str(result.run_dir))}</code>"
        if result.ok:
            self.progress.bar_style = "success"
            self._say(
                f"<b>✔ {recipe} matched its single-process reference</b>: max |loss − reference| = "
                f"{summary['max_abs_diff']:.3g}, max |param − reference| = {summary['max_param_diff']:.3g}, "
                f"{summary['duration']:.1f} s. {where}",
                OK_COLOR,
            )
        else:
            self.progress.bar_style = "danger"
            self.run_error = result.error
            self._say(
                f"<b>✘ {recipe} failed</b> ({where}):"
                f"<pre style='white-space:pre-wrap'>{html.escape(str(result.error))}</pre>",
                BAD_COLOR,
            )

    def _show_figures(self, result) -> None:
        from hyper_parallel.viz import run_figures

        try:
            out_dir = self.figures_dir / Path(result.run_dir).name if self.figures_dir is not None else None
            self.figures = run_figures(result.run_dir, out_dir=out_dir)
        except Exception as error:  # a failed run may have no traces or metrics
            self.run_status.value += (
                f"<br><span style='color:{INFO_COLOR}'>no figures: {html.escape(str(error))}</span>"
            )
            return
        self.figure_tabs.children = [
            widgets.Image(value=png_bytes(fig), format="png", layout=widgets.Layout(max_width="100%"))
            for fig in self.figures.values()
        ]
        self.figure_tabs.titles = tuple(self.figures)
        self.figure_tabs.layout.display = ""
