"""Small HTML displays the notebooks and the widgets share: recipe cards, tables, degrees as text.

Nothing here holds state; every value from a recipe or a run goes through ``html.escape``.
"""

from __future__ import annotations

import html

from hyper_parallel.mesh_dims import degrees_label
from hyper_parallel.recipes import registry
from launch.tables import table  # noqa: F401  (re-exported: launch.notebook.widgets.table)

OK_COLOR, BAD_COLOR, INFO_COLOR = "#1a7f37", "#cf222e", "#57606a"


def step_text(progress: dict) -> str:
    """One progress update in the figures' numbering (steps 0 .. steps-1, as timelines and tables
    count them): ``step 0 (1/2 done): loss ..., reference ...``."""
    done = progress["step"]  # the training loop reports how many steps are done
    return (
        f"step {done - 1} ({done}/{progress['steps']} done): loss {progress['loss']:.6f}, "
        f"single-process reference {progress['reference']:.6f}"
    )


def cli_command(
    recipe: str, degrees: dict[str, int], steps: int | None = None, options: dict[str, int] | None = None
) -> str:
    """The ``python -m launch run`` line doing the same run from a terminal (``options``: e.g. microbatches)."""
    parts = ["python -m launch run", recipe, f"--world {degrees['world_size']}"]
    parts += [f"--{k.replace('_', '-')} {v}" for k, v in degrees.items() if k != "world_size" and v != 1]
    parts += [f"--{k.replace('_', '-')} {v}" for k, v in (options or {}).items()]
    if steps is not None:
        parts.append(f"--steps {steps}")
    return " ".join(parts)


def recipe_card(name: str):
    """A recipe as an HTML block: title, description, matrix row, constraints, default and other meshes."""
    from IPython.display import HTML

    spec = registry.get(name)
    alternatives = "; ".join(degrees_label(a, world=True) for a in spec.alternatives) or "none"
    rows = [
        ("what", spec.description),
        ("matrix row", spec.matrix_row),
        ("constraints", spec.constraints() or "none beyond the mesh rules"),
        ("default run", degrees_label(spec.default, world=True)),
        ("also tested on", alternatives),
        ("CI tier", spec.tier or "-"),
        ("from a terminal", cli_command(spec.name, spec.default)),
    ]
    body = "".join(
        f"<tr><th style='text-align:left;vertical-align:top;padding-right:1em'>{html.escape(k)}</th>"
        f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
        for k, v in rows
    )
    return HTML(f"<h4>{html.escape(spec.name)} — {html.escape(spec.title)}</h4><table>{body}</table>")


WIDGET_HELP = """**The mesh widget.** Its selectors only offer values that occur in some valid mesh of the chosen
world size for this recipe; a combination that breaks a rule is explained (with the nearest valid
choice and a button to apply it) and **Launch** stays disabled. Launch runs `torchrun` workers in the
background: a progress bar over the steps, the workers' output under *worker output*, and the figures
in tabs when the run is done. The widget never runs by itself: headless runs (papermill, `make
workbook`) use the plain code cell after it, driven by the parameters cell. To run your pick there,
rebind the parameters: `PARAM = picker.degrees` (see the comment in that cell)."""


def widget_help():
    """How to use the mesh widget: the one copy of the text every notebook with a widget shows."""
    from IPython.display import Markdown

    return Markdown(WIDGET_HELP)
