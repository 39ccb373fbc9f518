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


TIER_LIST = re.compile(r"\b([lL][0-2])\b`?\s*[(:]\s*([A-Z][\w-]*(?:(?:\s*,\s*(?:and\s+)?|\s+and\s+)[A-Z][\w-]*)+)")
"""A tier named with a hand-written list of recipes: ``l1 (M3, M5, M7)`` or ``l2: S1, S2``."""


def tier_lists(text: str) -> list[tuple[str, set[str]]]:
    """Each hand-written tier list in ``text``: the tier and the recipe names given for it."""
    return [
        (tier.lower(), {name.strip() for name in re.split(r",|\band\b", names) if name.strip()})
        for tier, names in TIER_LIST.findall(text)
    ]


def test_a_tier_list_written_in_the_docs_is_the_registry_s():
    """A page (or pyproject.toml's marker help) that lists a tier's recipes by hand lists exactly the recipes whose
    registry row carries that tier; the generated table of docs/recipes.md is the one home of the tiers."""
    from hyper_parallel.recipes.registry import RECIPES

    by_tier = {tier: {name for name, recipe in RECIPES.items() if recipe.tier == tier} for tier in ("l0", "l1", "l2")}
    wrong = [
        (source.name, tier, sorted(names))
        for source in [*PAGES, ROOT / "pyproject.toml"]
        for tier, names in tier_lists(source.read_text())
        if names & set(RECIPES) and names != by_tier[tier]
    ]
    assert not wrong, f"tier lists that are not the registry's (recipes.md's tier column is): {wrong}"


def test_the_tier_list_check_sees_a_false_list():
    """The check above reads the forms a hand-written list takes (the false one docs/testing.md once held)."""
    text = "the tiers l1 (M3, M5, M6, M7, B-5, B-7), l2 (S1, S2, C, C-MoE) and l0: M1, M4 and M2"
    assert tier_lists(text) == [
        ("l1", {"M3", "M5", "M6", "M7", "B-5", "B-7"}),
        ("l2", {"S1", "S2", "C", "C-MoE"}),
        ("l0", {"M1", "M4", "M2"}),
    ]


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
    (a page that names a function where it no longer lives fails here)."""
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


def test_the_figures_page_describes_every_run_figure():
    """docs/figures.md names the drawing function of every row of the figure registry."""
    from hyper_parallel.viz import FIGURE_SPECS

    text = (ROOT / "docs" / "figures.md").read_text()
    assert [spec.name for spec in FIGURE_SPECS if f"`{spec.function}" not in text] == []


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors


def broken_links(page: Path) -> list[tuple[str, str, str]]:
    """The relative links of ``page`` that reach no file, or no heading of the file they name."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append((page.name, target, "no such file"))
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append((page.name, target, "no such heading"))
    return broken


def test_every_link_in_the_docs_reaches_its_page_and_heading():
    """A relative link ``[x](page.md#heading)`` resolves from the page that holds it to a file, and its
    anchor to one of that file's headings (a link to a heading that lives on another page fails here)."""
    broken = [link for page in PAGES for link in broken_links(page)]
    assert not broken, broken


def test_the_link_check_sees_a_missing_heading_and_a_missing_page(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## 4. Pipeline parallelism (P1)\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#4-pipeline-parallelism-p1) [ok](a.md) [moved](a.md#pipeline-parallelism) [gone](c.md#x) "
        "[web](https://example.org/#x) [here](#no-heading)\n"
    )
    assert broken_links(page) == [
        ("b.md", "a.md#pipeline-parallelism", "no such heading"),
        ("b.md", "c.md#x", "no such file"),
        ("b.md", "#no-heading", "no such heading"),
    ]
