"""The markup every page of the report shares: escaping, a figure as a data URI, number cells, degrees.

``page`` (one run), ``summary`` (its first screen), ``compare`` (two runs) and the planner's review page
(``launch.plan.review_page``) all build their HTML from these, so a number or a piece of run text looks and
escapes the same on each. Torch is never imported.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable
from typing import Any

from hyper_parallel.viz.style import png_bytes


def esc(value: Any) -> str:
    """Any value as text safe inside HTML and inside quoted attributes (log lines hold <, > and quotes)."""
    return html.escape(str(value), quote=True)


def png_data_uri(fig) -> str:
    """A figure (or the PNG bytes of one, e.g. the file a notebook saved) as an inline PNG, so the page
    stays one file that opens offline."""
    data = fig if isinstance(fig, bytes) else png_bytes(fig)
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def num_cell(value: Any, spec: str, key: str, step: int | None = None) -> str:
    """A right-aligned number: rounded text, exact ``repr`` in ``data-value``; "–" when missing."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"<td class='num' data-key='{esc(key)}'>–</td>"
    step_attr = f" data-step='{step}'" if step is not None else ""
    return f"<td class='num' data-key='{esc(key)}'{step_attr} data-value='{value!r}'>{value:{spec}}</td>"


def facts_table(rows: Iterable[tuple[str, str]]) -> str:
    """Rows of (label, already-escaped HTML)."""
    return "<table class='facts'>" + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"
