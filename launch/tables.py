"""Tables for the terminal (``print_table``) and for notebooks (``table``, HTML without pandas).

The bottom room of ``launch``: every command, report and widget may import it; it imports nothing of ours."""

from __future__ import annotations

import html
from typing import Any


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Columns padded to their widest cell, a rule under the header."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    for index, row in enumerate([header, *rows]):
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))


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
