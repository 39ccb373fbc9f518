"""Planning at scale in a notebook: a layout picker with the cost model's bars and the torchrun command.

    widget = PlanWidget("llama-8b-like", world_size=4096, dp_replicate=8, cp=2, tp=16)   # display it
    widget.degrees, widget.dims, widget.error, widget.cost, widget.command, widget.figure
    widget.set(tp=8)            # what the selectors do
    PlanWidget(model_config="config.json", world_size=512)   # your own model's Hugging Face config.json

The degree selectors offer only values that occur in a valid layout of the chosen model and world size
(``cost_model.layouts.candidate_layouts``, i.e. ``valid_choices``, screened by the model's shape rules);
a combination that breaks a rule shows the rule's message and the nearest valid layout. Nothing starts
a process: memory and communication come from the cost model, groups from ParallelDims' arithmetic,
so every change redraws at once (the bars are ``hyper_parallel.viz.planning.plan_figure``).
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets

from hyper_parallel.cost_model import CLI_MODELS, CostEstimate, ModelConfig, estimate, get_model, load_model_config
from hyper_parallel.cost_model.hardware import DEFAULT_HARDWARE
from hyper_parallel.cost_model.layouts import candidate_layouts, nearest_valid, nodes_spanned
from hyper_parallel.cost_model.step_time import estimate_step
from hyper_parallel.mesh import ParallelDims, check_world_size, dp_shard_left
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.viz.planning import plan_figure
from hyper_parallel.viz.style import png_bytes
from launch import inputs
from launch.notebook.widgets.picker import DEGREES, HELP
from launch.plan.build import MESH_DIMS, torchrun_command
from launch.tables import table

WORLD_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def _fits(config: ModelConfig, dims: ParallelDims) -> bool:
    try:
        config.check(dims)
    except ValueError:
        return False
    return True


def _check_settings(
    model: object, world_size: object, gpus_per_node: object, memory_gib: object, degrees: dict
) -> None:
    """``PlanWidget``'s arguments by the planner's rules (``launch plan``'s): a preset, a world within
    ``MAX_WORLD_SIZE``, whole numbers >= 1 (dp_shard -1: what is left), a positive memory."""
    inputs.widget_degrees(degrees, DEGREES)
    if model is not None and (not isinstance(model, str) or model not in CLI_MODELS):
        raise ValueError(f"model must be one of {', '.join(CLI_MODELS)} (or give model_config=), got {model!r}")
    check_world_size(world_size, "world_size")
    inputs.positive_int(gpus_per_node, "gpus_per_node")
    if isinstance(memory_gib, bool) or not isinstance(memory_gib, (int, float)) or not 0 < memory_gib < math.inf:
        raise ValueError(f"memory_gib must be a positive number of GiB per GPU such as 80, got {memory_gib!r}")


class PlanWidget(widgets.VBox):
    """Model, world size, GPUs per node and degree selectors; live bars, group table and torchrun command."""

    def __init__(
        self,
        model: str = "llama-8b-like",
        world_size: int = 4096,
        gpus_per_node: int = 8,
        memory_gib: float = 80.0,
        model_config: str | None = None,
        **degrees: int,
    ) -> None:
        _check_settings(model if model_config is None else None, world_size, gpus_per_node, memory_gib, degrees)
        self.memory_gib = memory_gib
        self._own_models = {}  # name -> ModelConfig read from a config.json (cost_model.load_model_config)
        if model_config is not None:
            own = load_model_config(model_config)
            self._own_models[own.name] = own
            model = own.name
        self._layouts: dict[tuple[str, int], list[ParallelDims]] = {}
        self._updating = False
        self._suggestion: dict[str, int] = {}
        self.dims: ParallelDims | None = None
        self.error: str | None = None
        self.cost: CostEstimate | None = None
        self.step = None  # the step-time estimate (cost_model.step_time) of a valid layout
        self.command, self.figure = "", None
        self._build_controls(model, world_size, gpus_per_node)
        self._connect_controls()
        super().__init__(
            children=[
                widgets.HBox([self.model_selector, self.world_selector, self.gpus_selector]),
                widgets.HBox([self.selectors[name] for name in DEGREES[:3]]),
                widgets.HBox([self.selectors[name] for name in DEGREES[3:]]),
                self.status,
                self.fix_button,
                self.bars,
                self.groups,
                self.command_box,
            ]
        )
        wanted = {name: degrees.get(name, 1) for name in DEGREES}
        if degrees.get(MeshDim.DP_SHARD, -1) == -1:  # "whatever is left"
            wanted[MeshDim.DP_SHARD] = dp_shard_left(world_size, wanted) or 1
        self._load(wanted)

    def _build_controls(self, model: str, world_size: int, gpus_per_node: int) -> None:
        """The controls: model, world size, GPUs per node, one selector per degree (filled by ``_load``), the
        status line with its fix button, the bars, the group table and the command."""
        style = {"description_width": "initial"}
        self.model_selector = widgets.Dropdown(
            options=(*self._own_models, *CLI_MODELS), value=model, description="model", style=style
        )
        self.world_selector = widgets.Dropdown(
            options=sorted(set(WORLD_SIZES) | {world_size}),
            value=world_size,
            description="world_size",
            style=style,
            tooltip=HELP["world_size"],
        )
        self.gpus_selector = widgets.Dropdown(
            options=sorted({1, 2, 4, 8, 16, gpus_per_node}),
            value=gpus_per_node,
            description="GPUs per node",
            style=style,
        )
        self.selectors = {
            name: widgets.Dropdown(
                description=name, style=style, tooltip=HELP[name], layout=widgets.Layout(width="150px")
            )
            for name in DEGREES
        }
        self.status, self.groups, self.command_box = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.fix_button = widgets.Button(
            description="use the nearest valid layout",
            icon="wrench",
            layout=widgets.Layout(width="fit-content", display="none"),
        )
        self.bars = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))

    def _connect_controls(self) -> None:
        """A new model or world size loads a new list of layouts (and moves to the nearest valid one); GPUs per
        node or a degree re-costs the selection."""
        for selector in (self.model_selector, self.world_selector):  # a new list of layouts: the nearest valid one
            selector.observe(lambda change: self._load(), names="value")
        for selector in (self.gpus_selector, *self.selectors.values()):
            selector.observe(lambda change: self._refresh(), names="value")
        self.fix_button.on_click(lambda _: self.set(**self._suggestion))

    # ------------------------------------------------------------------ public API
    @property
    def config(self) -> ModelConfig:
        name = self.model_selector.value
        return self._own_models[name] if name in self._own_models else get_model(name)

    @property
    def degrees(self) -> dict[str, int]:
        return {"world_size": self.world_selector.value, **{n: self.selectors[n].value for n in DEGREES}}

    def layouts(self, world_size: int | None = None) -> list[ParallelDims]:
        """Every valid layout of the selected model on ``world_size`` ranks (default: the selected one)."""
        key = (self.model_selector.value, world_size or self.world_selector.value)
        if key not in self._layouts:
            config = self.config
            self._layouts[key] = [d for d in candidate_layouts(key[1], config.is_moe) if _fits(config, d)]
        return self._layouts[key]

    def set(self, **values: int) -> None:
        """Select a model, world size, GPUs per node and/or degrees at once. Degrees given are kept (an invalid
        combination is explained); without degrees a new model or world size moves to the nearest valid layout."""
        unknown = set(values) - {"model", "world_size", "gpus_per_node", *DEGREES}
        if unknown:
            raise ValueError(
                f"unknown setting(s) {sorted(unknown)}; known: model, world_size, gpus_per_node, {', '.join(DEGREES)}"
            )
        self._updating = True
        try:
            if "model" in values:
                self.model_selector.value = values["model"]
            if "world_size" in values:
                self.world_selector.value = values["world_size"]
            if "gpus_per_node" in values:
                self.gpus_selector.value = values["gpus_per_node"]
        finally:
            self._updating = False
        given = {n: values[n] for n in DEGREES if n in values}
        self._load({**{n: self.selectors[n].value for n in DEGREES}, **given} if given else None)

    # ------------------------------------------------------------------ selection
    def _load(self, wanted: dict[str, int] | None = None) -> None:
        """Offer the degree values of the valid layouts; keep ``wanted`` (default: the nearest valid one)."""
        if self._updating:
            return
        layouts = self.layouts()
        current = {n: self.selectors[n].value or 1 for n in DEGREES}
        if wanted is None:
            nearest = nearest_valid(layouts, current)
            wanted = {n: getattr(nearest, n) for n in DEGREES} if nearest else current
        self._updating = True
        try:
            for name in DEGREES:
                offered = {getattr(d, name) for d in layouts}
                value = wanted.get(name, 1)
                options = sorted(offered | {value})
                self.selectors[name].options = [
                    (str(v) if v in offered else f"{v} (no valid layout)", v) for v in options
                ]
                self.selectors[name].value = value
        finally:
            self._updating = False
        self._refresh()

    def _refresh(self) -> None:
        if self._updating:
            return
        degrees = self.degrees
        try:
            self.dims = ParallelDims(**degrees)
            self.cost = estimate(self.config, self.dims)
            self.error = None
        except ValueError as error:
            self.dims, self.cost, self.error = None, None, str(error)
            self._show_invalid(degrees)
            return
        self.fix_button.layout.display = "none"
        gpus = self.gpus_selector.value
        hardware = DEFAULT_HARDWARE.replace(memory_gib=self.memory_gib)
        self.step = estimate_step(self.cost, gpus, hardware)
        self.figure = plan_figure(self.cost, self.step.timed, self.memory_gib)
        self.bars.value = png_bytes(self.figure, dpi=80)
        self.status.value = (
            f"<b style='color:#1a7f37'>✔ valid</b>: {html.escape(self.dims.label())}; "
            f"{self.cost.parameter_count:.3g} parameters, {len(self.layouts())} valid layouts of "
            f"{self.dims.world_size} ranks for {html.escape(self.config.name)}; step "
            f"{self.step.seconds:.3g} s ({self.step.fast.total:.3g}-{self.step.slow.total:.3g}), "
            f"MFU {self.step.middle.mfu:.0%} on {html.escape(hardware.describe())}"
        )
        self.groups.value = self._group_table(gpus)
        self.command = torchrun_command(self.config, self.dims, gpus, "$MASTER_ADDR:29500")
        self.command_box.value = f"<b>multi-node command</b><pre>{html.escape(self.command)}</pre>"

    def _show_invalid(self, degrees: dict[str, int]) -> None:
        nearest = nearest_valid(self.layouts(), {n: degrees[n] for n in DEGREES})
        hint = ""
        self._suggestion = {}
        if nearest is not None:
            self._suggestion = {n: getattr(nearest, n) for n in DEGREES if getattr(nearest, n) != degrees[n]}
            hint = "<br>nearest valid layout: <b>" + html.escape(nearest.label()) + "</b>"
            self.fix_button.layout.display = ""
        self.status.value = f"<b style='color:#cf222e'>✘ invalid</b>: {html.escape(self.error)}{hint}"

    def _group_table(self, gpus: int) -> str:
        rows = []
        for dim in MESH_DIMS:
            try:
                groups = self.dims.group_ranks(dim)
            except ValueError:
                continue
            if len(groups[0]) > 1:
                spans = nodes_spanned(self.dims, dim, gpus)
                first = groups[0] if len(groups[0]) <= 8 else groups[0][:3] + ["…", groups[0][-1]]
                rows.append(
                    [dim, len(groups[0]), len(groups), f"{spans}" + (" (crosses)" if spans > 1 else ""), str(first)]
                )
        return table(
            ["dim", "size", "groups", "nodes per group", "rank 0's group"],
            rows,
            caption=f"groups with {gpus} GPUs per node",
        ).data
