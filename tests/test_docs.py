"""The README and docs/ say what the repository holds: one home per fact, generated tables equal to the
registry they come from, and every file they name exists."""

from __future__ import annotations

import re
from pathlib import Path

from hyper_parallel.recipes.registry import TABLE_MARKER, markdown_table

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w./-])((?:hyper_parallel|launch|tests|docs|notebooks|tools)/[\w./-]*\w)")


def test_the_readme_is_a_short_tour():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_the_recipe_table_is_the_registry():
    text = (ROOT / "docs" / "recipes.md").read_text()
    assert TABLE_MARKER in text, "docs/recipes.md lost its generated table"
    table = text.split(TABLE_MARKER, 1)[1].split("\n\n", 1)[0].strip()
    assert table == markdown_table(), "docs/recipes.md's table is not the registry's: run make docs"


def test_every_path_the_docs_name_exists():
    """A file or folder named as ``hyper_parallel/...``, ``launch/...``, ``tests/...``, ``docs/...`` exists
    (a notebook may be named without ``.ipynb``; glob-like names such as ``plan*.py`` must match something)."""
    missing = []
    for page in PAGES:
        for name in PATH.findall(page.read_text()):
            name = name.rstrip(".")
            if "*" in name or "<" in name or "{" in name:
                if not list(ROOT.glob(re.sub(r"[<{].*", "*", name))):
                    missing.append((page.name, name))
            elif not any((ROOT / f"{name}{suffix}").exists() for suffix in ("", ".ipynb")):
                missing.append((page.name, name))
    assert not missing, missing


DOTTED = re.compile(r"`((?:hyper_parallel|launch)(?:\.\w+)+)`")


def test_every_dotted_name_the_docs_give_imports():
    """``launch.notebook.tables.exposure_table`` in a page resolves: the module imports and has the name
    (a moved function left a page pointing at the old module once)."""
    import importlib

    missing = []
    for page in PAGES:
        for dotted in set(DOTTED.findall(page.read_text())):
            parts = dotted.split(".")
            for split in range(len(parts), 0, -1):
                try:
                    found = importlib.import_module(".".join(parts[:split]))
                except ImportError:
                    continue
                for attribute in parts[split:]:
                    found = getattr(found, attribute, None)
                if found is None:
                    missing.append((page.name, dotted))
                break
            else:
                missing.append((page.name, dotted))
    assert not missing, missing
