"""A small HTML table for notebooks (results without pandas): a leaf the command modules and widgets share."""

from __future__ import annotations

import html
from typing import Any


def table(header: list[str], rows: list[list[Any]], caption: str | None = None):
    """``IPython.display.HTML`` of a table; every cell is escaped."""
    from IPython.display import HTML

    head = "".join(f"<th style='text-align:left'>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return HTML(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
