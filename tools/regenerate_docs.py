"""``make docs``: rewrite the generated parts of docs/ from the code they come from.

The tests that hold them (tests/test_docs.py) only compare, and name this command when they differ.
"""

from __future__ import annotations

from pathlib import Path

from hyper_parallel.recipes.registry import TABLE_MARKER, markdown_table

DOCS = Path(__file__).resolve().parents[1] / "docs"


def recipe_table() -> Path:
    """docs/recipes.md's matrix: what follows its marker line, up to the first blank line."""
    page = DOCS / "recipes.md"
    head, rest = page.read_text(encoding="utf-8").split(TABLE_MARKER, 1)
    rest = rest.split("\n\n", 1)[1] if "\n\n" in rest else ""
    page.write_text(f"{head}{TABLE_MARKER}{markdown_table()}\n\n{rest}", encoding="utf-8")
    return page


if __name__ == "__main__":
    for written in (recipe_table(),):
        print(f"wrote {written}")
