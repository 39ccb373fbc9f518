"""Small HTML displays the notebooks and the widgets share: recipe cards, tables, degrees as text.

Nothing here holds state; every value from a recipe or a run goes through ``html.escape``.
"""
from __future__ import annotations

import html
import io
from typing import Any

from hyper_parallel.recipes import registry

OK_COLOR, BAD_COLOR, INFO_COLOR = "#1a7f37", "#cf222e", "#57606a"


def png_bytes(fig, dpi: int = 90) -> bytes:
    """A matplotlib Figure as PNG bytes for an ``ipywidgets.Image``."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def degrees_text(degrees: dict[str, int]) -> str:
    """``world_size=4: dp_replicate=2, dp_shard=2`` (degrees of 1 left out)."""
    shown = [f"{k}={v}" for k, v in degrees.items() if k != "world_size" and v != 1]
    return f"world_size={degrees['world_size']}" + (": " + ", ".join(shown) if shown else "")


def cli_command(recipe: str, degrees: dict[str, int], steps: int | None = None) -> str:
    """The ``python -m launch run`` line doing the same run from a terminal."""
    parts = ["python -m launch run", recipe, f"--world {degrees['world_size']}"]
    parts += [f"--{k.replace('_', '-')} {v}" for k, v in degrees.items() if k != "world_size" and v != 1]
    if steps is not None:
        parts.append(f"--steps {steps}")
    return " ".join(parts)


def recipe_card(name: str):
    """A recipe as an HTML block: title, description, matrix row, constraints, default and other meshes."""
    from IPython.display import HTML
    spec = registry.get(name)
    alternatives = "; ".join(degrees_text(a) for a in spec.alternatives) or "none"
    rows = [("what", spec.description), ("matrix row (seed 002)", spec.matrix_row),
            ("constraints", spec.constraints() or "none beyond the mesh rules"),
            ("default run", degrees_text(spec.default)), ("also tested on", alternatives),
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
