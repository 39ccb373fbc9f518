"""``make docs``: rewrite the generated parts of docs/ from the code they come from.

The tests that hold them (tests/test_docs.py, test_planner_validation.py, test_review.py) only compare,
and name this command when they differ.
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


def planner_validation() -> Path:
    """docs/planner_validation.md: the cost model against the published runs."""
    from hyper_parallel.cost_model.validation_doc import render

    page = DOCS / "planner_validation.md"
    page.write_text(render(), encoding="utf-8")
    return page


def design_review() -> list[Path]:
    """docs/design_review_512.md and .html: the worked design review (left alone when only its timestamp and
    PNG bytes would change)."""
    from launch.plan import review_example

    if review_example.is_current(DOCS):
        return []
    review_example.write(DOCS)
    return [DOCS / "design_review_512.md", DOCS / "design_review_512.html"]


if __name__ == "__main__":
    for written in (recipe_table(), planner_validation(), *design_review()):
        print(f"wrote {written}")
