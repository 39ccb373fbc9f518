"""``BenchWidget``: pick the world size, configurations and number of pairs of ``python -m launch bench``.

Only configurations that exist for the chosen world size are offered (HSDP and FSDP+TP need 4 ranks).
Run starts ``launch.bench.fsdp2.run_bench`` in a background thread (a torchrun subprocess, never a fork of
the kernel) and shows the table and the ratio figure when it is done. papermill never clicks: the
notebook's plain code cell runs the default benchmark.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from hyper_parallel.benchmark.configs import configurations
from hyper_parallel.viz.style import png_bytes
from launch.notebook.widgets.display import BAD_COLOR, INFO_COLOR, OK_COLOR


class BenchWidget(widgets.VBox):
    """Ranks, configurations, number of pairs and Run; the table and figure appear in ``results``.

    The background thread fills ``results`` by assigning widget children: an ``Output`` widget's capture
    context is not thread-safe (another cell's output would land in it). ``runner`` replaces
    ``launch.bench.fsdp2.run_bench`` (tests)."""

    def __init__(
        self,
        world_size: int = 4,
        steps: int = 10,
        out: str | Path | None = None,
        timeout: float = 1200.0,
        runner: Callable[..., Any] | None = None,
    ) -> None:
        self.out, self.timeout = out, timeout
        self._runner = runner
        self.thread: threading.Thread | None = None
        self.result = None
        self.world = widgets.ToggleButtons(options=[2, 4], value=world_size, description="ranks")
        self.configs = widgets.SelectMultiple(description="configs", rows=3)
        self.steps = widgets.IntSlider(value=steps, min=2, max=50, description="pairs")
        self.run_button = widgets.Button(description="Run benchmark", button_style="success", icon="play")
        self.status = widgets.HTML()
        self.results = widgets.VBox()
        self.world.observe(lambda _: self._offer_configs(), names="value")
        self.run_button.on_click(lambda _: self.launch())
        self._offer_configs()
        super().__init__(
            [widgets.HBox([self.world, self.steps]), self.configs, self.run_button, self.status, self.results]
        )

    def _offer_configs(self) -> None:
        """Every configuration of the world size; chosen at first: the default set (TP+SP and AsyncTP run
        when picked)."""
        self.configs.options = [config.name for config in configurations(self.world.value)]
        self.configs.value = tuple(c.name for c in configurations(self.world.value, include_optional=False))

    def _say(self, color: str, text: str) -> None:
        self.status.value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    def launch(self) -> None:
        """What Run does: the benchmark in a background thread; the table and figure appear when done."""
        if self.thread is not None and self.thread.is_alive():
            return
        if not self.configs.value:
            self._say(BAD_COLOR, "choose at least one configuration")
            return
        self.run_button.disabled = True
        pairs, world, chosen = self.steps.value, self.world.value, list(self.configs.value)
        self._say(INFO_COLOR, f"running {', '.join(chosen)} on {world} ranks, {pairs} alternated pairs each ...")
        self.thread = threading.Thread(target=self._run, args=(world, pairs, chosen), daemon=True)
        self.thread.start()

    def _run(self, world: int, pairs: int, chosen: list[str]) -> None:
        from hyper_parallel.viz.benchmark import ratio_figure
        from launch.bench.fsdp2 import bench_table, run_bench

        runner = self._runner or run_bench
        try:
            self.result = runner(world, steps=pairs, out=self.out, configs=chosen, timeout=self.timeout)
            if not self.result.ok:
                self._say(BAD_COLOR, f"failed: {self.result.error}")
                return
            self.results.children = [
                widgets.HTML(bench_table(self.result).data),
                widgets.Image(value=png_bytes(ratio_figure(self.result.rows, world))),
            ]
            medians = ", ".join(f"{row['config']} {row['ratio']['median']:.3f}" for row in self.result.rows)
            self._say(OK_COLOR, f"done: median step-time ratio ours / torch: {medians}")
        except Exception as error:  # shown in the widget: a thread has nobody else to tell
            self._say(BAD_COLOR, f"{type(error).__name__}: {error}")
        finally:
            self.run_button.disabled = False

    def wait(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)
