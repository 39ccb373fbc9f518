"""The report's figures: their captions, an inlined PNG per figure, a note for each one not drawn.

The figures are ``hyper_parallel.viz`` ones (``run_figures``); their registry (``viz.FIGURE_SPECS``) gives
each one's title, what to notice in it and, for one not drawn, the input the run lacked. Torch is never
imported.
"""

from __future__ import annotations

from typing import Any

from hyper_parallel.viz.figure_registry import NEEDS, SPECS
from launch.report.markup import esc, png_data_uri


def figure_block(name: str, fig) -> str:
    """One inlined figure with its caption (what to look for in it)."""
    spec = SPECS.get(name)
    title, notice = (spec.title, spec.notice) if spec else (name.replace("_", " "), "")
    return (
        f"<figure id='figure-{esc(name)}' data-figure='{esc(name)}'>"
        f"<img src='{png_data_uri(fig)}' alt='{esc(title)}'>"
        f"<figcaption><b>{esc(title)}.</b> {esc(notice)}</figcaption></figure>"
    )


def figure_blocks(names: list[str], figures: dict[str, Any], missing: dict[str, str]) -> str:
    """The figures of ``names`` in order; a note saying why for each one that could not be drawn."""
    return "".join(
        figure_block(name, figures[name])
        if name in figures
        else f"<p class='note' data-missing-figure='{esc(name)}'>{esc(SPECS[name].title)}: not drawn, "
        f"{esc(missing.get(name, NEEDS[SPECS[name].needs]))}.</p>"
        for name in names
    )


def other_figures_section(figures: dict[str, Any]) -> str:
    """Figures ``run_figures`` draws that this page has no place for yet: shown rather than dropped."""
    others = [name for name in figures if name not in SPECS]
    if not others:
        return ""
    return (
        "<section id='other-figures'><h2>Other figures</h2>"
        + "".join(figure_block(name, figures[name]) for name in others)
        + "</section>"
    )
