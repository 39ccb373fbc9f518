"""The degree picker: recipe, world size and degree selectors that offer only valid meshes.

The selectors only offer values that occur in at least one valid mesh of the chosen world size and
recipe (``valid_choices`` + ``Recipe.validate``); a combination that breaks a rule is explained with
the rule's own message and the nearest valid choice (one click applies it), and a live mesh-map
preview shows the last valid selection. Nothing here starts a worker: ``MeshWidget`` adds that.
"""

from __future__ import annotations

import html
import os

import ipywidgets as widgets

from hyper_parallel.mesh import CHOICE_DEGREES, ParallelDims, dp_shard_left, valid_choices
from hyper_parallel.mesh_dims import MESH_ORDER, STAGE_DEGREES, MeshDim, degrees_label
from hyper_parallel.recipes import registry
from hyper_parallel.recipes.options import microbatch_choices
from hyper_parallel.viz.style import png_bytes
from launch import inputs  # the same rules as launch.run and the CLI
from launch.notebook.widgets.display import BAD_COLOR, INFO_COLOR, OK_COLOR, cli_command

DEGREES = STAGE_DEGREES
PICKER_DEGREES = MESH_ORDER
"""The picker's selectors: pp first (outermost); recipes that do not pipeline only offer pp=1."""
HELP = {
    "world_size": "number of ranks (worker processes)",
    MeshDim.DP_REPLICATE: "replica groups: gradients all-reduced across them (HSDP's outer dim)",
    MeshDim.DP_SHARD: "ranks that shard parameters (FSDP)",
    MeshDim.CP: "context parallel: the sequence is split over these ranks",
    MeshDim.ULYSSES: "Ulysses: each cp rank's share of the sequence split again, heads resharded by all-to-all",
    MeshDim.TP: "tensor parallel: weights are split over these ranks (innermost, contiguous)",
    MeshDim.EP: "expert parallel: experts spread over these ranks (borrowed, not a factor of world_size)",
    MeshDim.ETP: "expert tensor parallel: each expert's hidden dim split (1 or tp)",
    MeshDim.PP: "pipeline parallel: the layers split into stages (outermost: each stage is a block of ranks)",
}


def valid_meshes(recipe: str, world_size: int) -> list[ParallelDims]:
    """Every mesh of ``world_size`` ranks that ``recipe`` accepts (its constraints and shapes included)."""
    spec = registry.get(recipe)
    meshes = []
    names = DEGREES if MeshDim.ULYSSES in spec.must_exceed_one else CHOICE_DEGREES
    for dims in valid_choices(world_size, names=names, pipeline=MeshDim.PP in spec.must_exceed_one):
        try:
            meshes.append(spec.validate(**dims.degrees()))
        except ValueError:
            continue
    return meshes


def _differences(dims: ParallelDims, wanted: dict[str, int]) -> int:
    return sum(getattr(dims, name) != value for name, value in wanted.items())


class DegreePicker(widgets.VBox):
    """Selectors for one recipe's degrees with live validation and a mesh-map preview.

    ``recipe``: the recipe (``recipes``: others offered in a drop-down, e.g. a notebook's family);
    ``world_size`` and the degrees start the selection (default: the recipe's default run);
    ``max_world_size`` bounds the world-size choices; ``microbatches`` (pipeline recipes) starts the
    microbatch selector, which offers only the counts that fit the mesh. Subclasses add rows with ``_rows`` and react to
    a new selection in ``_update_controls``.
    """

    def __init__(
        self,
        recipe: str = "M4",
        *,
        recipes: tuple[str, ...] | list[str] | None = None,
        steps: int | None = None,
        microbatches: int | None = None,
        max_world_size: int = 8,
        preview: bool = True,
        **degrees: int,
    ) -> None:
        spec = registry.get(inputs.recipe_name(recipe))
        steps = None if steps is None else inputs.steps(steps)
        inputs.widget_selection(steps, microbatches, max_world_size, degrees, PICKER_DEGREES)
        names = [registry.get(name).name for name in (recipes or [spec.name])]
        if spec.name not in names:
            names.insert(0, spec.name)
        self.max_world_size, self.preview_enabled = max_world_size, preview
        self._updating = False
        self._last_changed: str | None = None
        self._suggestion: dict[str, int] | None = None
        self._valid_cache: dict[tuple[str, int], list[ParallelDims]] = {}
        self.preview_figure = None
        self._preview_key = None
        self.dims: ParallelDims | None = None
        self.error: str | None = None
        self._build_controls(names, spec.name, steps or spec.steps, microbatches)
        self._connect_controls()
        super().__init__(children=self._rows())
        self._load(spec.name, spec.resolve_degrees(degrees))  # as launch.run: world_size from the degrees if omitted

    def _build_controls(self, names: list[str], recipe: str, steps: int, microbatches: int | None) -> None:
        """The controls (recipe, world size, steps, microbatches, degrees, status, preview), filled by ``_load``."""
        style = {"description_width": "initial"}
        self.header = widgets.HTML()
        self.recipe_selector = widgets.Dropdown(
            options=names,
            value=recipe,
            description="recipe",
            layout=widgets.Layout(width="210px", display="" if len(names) > 1 else "none"),
        )
        self.world_selector = widgets.Dropdown(
            description="world_size", style=style, layout=widgets.Layout(width="150px"), tooltip=HELP["world_size"]
        )
        self.steps_selector = widgets.BoundedIntText(
            value=steps, min=1, max=inputs.MAX_WIDGET_STEPS, description="steps", layout=widgets.Layout(width="130px")
        )
        self.microbatches_selector = widgets.Dropdown(
            options=[microbatches] if microbatches is not None else [],
            value=microbatches,
            description="microbatches",
            style=style,
            tooltip="microbatches per data-parallel rank and step: only counts that fit the mesh are offered",
            layout=widgets.Layout(width="170px", display="none"),
        )
        self.selectors = {
            name: widgets.Dropdown(
                description=name, style=style, tooltip=HELP[name], layout=widgets.Layout(width="150px")
            )
            for name in PICKER_DEGREES
        }
        self.status = widgets.HTML()
        self.fix_button = widgets.Button(
            description="use the nearest valid choice",
            icon="wrench",
            layout=widgets.Layout(width="fit-content", display="none"),
        )
        hidden_until_drawn = widgets.Layout(max_width="100%", display="none")
        self.preview = widgets.Image(format="png", layout=hidden_until_drawn)
        self.preview_caption = widgets.HTML()

    def _connect_controls(self) -> None:
        """Each control to its handler: a recipe or world size reloads the choices, the others re-check the selection."""
        self.recipe_selector.observe(self._on_recipe, names="value")
        self.world_selector.observe(self._on_world, names="value")
        for name, selector in self.selectors.items():
            selector.observe(lambda change, name=name: self._on_degree(name, change), names="value")
        self.steps_selector.observe(lambda change: self._refresh(), names="value")
        self.microbatches_selector.observe(lambda change: None if self._updating else self._refresh(), names="value")
        self.fix_button.on_click(lambda _: self.apply_suggestion())

    def _rows(self) -> list[widgets.Widget]:
        return [
            self.header,
            widgets.HBox([self.recipe_selector, self.world_selector, self.steps_selector, self.microbatches_selector]),
            widgets.HBox([self.selectors[name] for name in PICKER_DEGREES[:3]]),
            widgets.HBox([self.selectors[name] for name in PICKER_DEGREES[3:]]),
            self.status,
            self.fix_button,
            self.preview_caption,
            self.preview,
        ]

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
        """The current selection, ``world_size`` first: pass it to ``launch.run(recipe, **degrees)``
        (``pp`` only when a pipeline recipe selects pp > 1)."""
        pp = self.selectors[MeshDim.PP].value
        return {
            "world_size": self.world_size,
            **({MeshDim.PP: pp} if pp != 1 else {}),
            **{name: self.selectors[name].value for name in DEGREES},
        }

    @property
    def steps(self) -> int:
        return self.steps_selector.value

    @property
    def options(self) -> dict[str, int]:
        """The recipe options picked (a pipeline recipe's ``microbatches``): pass them to ``launch.run`` too."""
        shown = self.microbatches_selector.layout.display != "none"
        value = self.microbatches_selector.value
        return {"microbatches": value} if shown and value is not None else {}

    @property
    def valid(self) -> bool:
        return self.error is None

    def choices(self, world_size: int | None = None) -> list[ParallelDims]:
        """The valid meshes of the current recipe on ``world_size`` ranks (default: the selected one)."""
        key = (self.recipe, world_size or self.world_size)
        if key not in self._valid_cache:
            self._valid_cache[key] = valid_meshes(*key)
        return self._valid_cache[key]

    def set(self, **degrees: int) -> None:
        """Select ``world_size`` and/or degrees at once (values no valid mesh uses are allowed and explained)."""
        inputs.widget_degrees(degrees, PICKER_DEGREES)
        merged = {**self.degrees, **degrees}
        self._last_changed = next((name for name in PICKER_DEGREES if name in degrees), None)
        self._load(self.recipe, merged)

    def apply_suggestion(self) -> None:
        if self._suggestion:
            self.set(**self._suggestion)

    # ------------------------------------------------------------------ hooks for subclasses
    def _selection_locked(self) -> bool:
        """True while the selection must not change (``MeshWidget``: a run is going)."""
        return False

    def _update_controls(self) -> None:
        """Enable or disable the controls after a change of the selection or of the lock."""
        locked = self._selection_locked()
        controls = [self.recipe_selector, self.world_selector, self.steps_selector, self.microbatches_selector]
        for selector in [*controls, *self.selectors.values()]:
            selector.disabled = locked
        self.fix_button.disabled = locked

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
            values = {name: wanted.get(name, 1) for name in PICKER_DEGREES}
            if values[MeshDim.DP_SHARD] in (None, -1):  # "whatever is left"
                values[MeshDim.DP_SHARD] = dp_shard_left(world, values) or 1
            offered = self._offered(world)
            for name in PICKER_DEGREES:
                selector = self.selectors[name]
                options = sorted(offered[name] | {values[name]})
                selector.options = [(str(v) if v in offered[name] else f"{v} (no valid mesh)", v) for v in options]
                selector.value = values[name]
        finally:
            self._updating = False
        self._refresh()

    def _offered(self, world: int) -> dict[str, set[int]]:
        valid = self.choices(world)
        return {name: {getattr(dims, name) for dims in valid} for name in PICKER_DEGREES}

    def _nearest(self, wanted: dict[str, int], world: int, keep: str | None = None) -> ParallelDims | None:
        """The valid mesh of ``world`` ranks differing from ``wanted`` in the fewest degrees
        (keeping ``keep`` at its value when some valid mesh allows it)."""
        valid = self.choices(world)
        if keep is not None and any(getattr(d, keep) == wanted.get(keep, 1) for d in valid):
            valid = [d for d in valid if getattr(d, keep) == wanted.get(keep, 1)]
        if not valid:
            return None
        default = self.spec.default
        # fewest changed degrees; then prefer not to switch off a parallelism that is on; then the recipe default
        return min(
            valid,
            key=lambda d: (
                _differences(d, {k: wanted.get(k, 1) for k in PICKER_DEGREES}),
                sum(getattr(d, k) == 1 < wanted.get(k, 1) for k in PICKER_DEGREES),
                _differences(d, {k: default.get(k, 1) for k in PICKER_DEGREES}),
            ),
        )

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
        current = {name: self.selectors[name].value for name in PICKER_DEGREES}
        nearest = self._nearest(current, world)
        self._last_changed = None
        self._load(self.recipe, {"world_size": world, **(nearest.degrees() if nearest else current)})

    def _on_degree(self, name: str, change) -> None:
        if self._updating:
            return
        self._last_changed = name
        self._refresh()

    def _refresh(self) -> None:
        """Validate the selection; update the explanation, the suggestion, the preview and the controls."""
        degrees = self.degrees
        try:
            dims = self.spec.validate(**degrees)
        except ValueError as error:
            self.dims, self.error = None, str(error)
        else:
            self.dims, self.error = dims, None
        self._offer_microbatches()
        self._suggestion = None
        if self.error is None:
            self._show_valid(degrees)
        else:
            self._show_invalid(degrees)
        self.header.value = self._header()
        self._update_controls()

    def _offer_microbatches(self) -> None:
        """A pipeline recipe on a valid mesh: offer the microbatch counts that fit it, keeping the pick
        while it still fits (else the recipe's default, adapted to the mesh)."""
        spec, selector = self.spec, self.microbatches_selector
        options = spec.options(self.dims) if self.dims is not None else None
        choices = microbatch_choices(spec.shapes, self.dims, options) if options is not None else []
        selector.layout.display = "" if choices else "none"
        if not choices:
            return
        value = selector.value if selector.value in choices else options.microbatches
        self._updating = True
        try:
            selector.options = choices
            selector.value = value
        finally:
            self._updating = False

    def _show_valid(self, degrees: dict[str, int]) -> None:
        note = ""
        if degrees["world_size"] > (os.cpu_count() or 1):
            note = (
                f"<br><span style='color:{INFO_COLOR}'>{degrees['world_size']} ranks on {os.cpu_count()} cores: "
                "works (gloo on CPU), just slower</span>"
            )
        views = "\n".join(html.escape(line.strip()) for line in self.dims.describe().splitlines()[1:])
        self.status.value = (
            f"<div style='color:{OK_COLOR}'><b>✔ valid</b>: {html.escape(degrees_label(degrees, world=True))}"
            f"<pre style='margin:2px 0;font-size:85%;line-height:1.25;color:{OK_COLOR}'>{views}</pre>"
            f"same run from a terminal: "
            f"<code>{html.escape(cli_command(self.recipe, degrees, self.steps, self.options))}</code>{note}</div>"
        )
        self.fix_button.layout.display = "none"
        self._update_preview()

    def _show_invalid(self, degrees: dict[str, int]) -> None:
        nearest = self._nearest(degrees, degrees["world_size"], keep=self._last_changed)
        hint = ""
        if nearest is not None:
            changes = {k: getattr(nearest, k) for k in PICKER_DEGREES if getattr(nearest, k) != degrees.get(k, 1)}
            self._suggestion = changes
            hint = (
                "<br>nearest valid choice: <b>"
                + html.escape(", ".join(f"{k}={v}" for k, v in changes.items()))
                + "</b>"
            )
            self.fix_button.description = "use " + ", ".join(f"{k}={v}" for k, v in changes.items())
            self.fix_button.layout.display = ""
        else:
            self.fix_button.layout.display = "none"
        self.status.value = (
            f"<div style='color:{BAD_COLOR}'><b>✘ invalid</b>: {html.escape(self.error)}{hint}"
            "<br><i>Launch is disabled until the degrees are valid.</i></div>"
        )
        if self.preview_figure is not None:
            self.preview_caption.value = (
                f"<span style='color:{INFO_COLOR}'>mesh map of the last valid choice "
                "(the current one is invalid)</span>"
            )

    def _header(self) -> str:
        spec = self.spec
        constraints = spec.constraints() or "none beyond the mesh rules"
        return (
            f"<b>{html.escape(spec.name)} — {html.escape(spec.title)}</b><br>"
            f"<span style='font-size:90%'>{html.escape(spec.description)}<br>recipe constraints: "
            f"<code>{html.escape(constraints)}</code>; default run: "
            f"<code>{html.escape(degrees_label(spec.default, world=True))}</code></span>"
        )

    def _update_preview(self) -> None:
        if not self.preview_enabled or self.dims is None:
            return
        caption = f"<b>mesh map</b> of {html.escape(degrees_label(self.degrees, world=True))}"
        if self.preview_figure is not None and self._preview_key == (self.recipe, self.dims):
            self.preview_caption.value = caption
            return
        from hyper_parallel.viz import mesh_map

        self._preview_key = (self.recipe, self.dims)
        self.preview_figure = mesh_map(self.dims, self.recipe)
        self.preview.value = png_bytes(self.preview_figure, dpi=80)
        self.preview.layout.display = ""
        self.preview_caption.value = caption
