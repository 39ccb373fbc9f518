"""The report's figures: their captions, an inlined PNG per figure, a note for each one not drawn.

The figures are ``hyper_parallel.viz`` ones (``run_figures``); ``CAPTIONS`` says, per figure, its title and
what to notice, ``MISSING`` the default reason one was not drawn. Torch is never imported.
"""

from __future__ import annotations

from typing import Any

from launch.report.markup import esc, png_data_uri

# name -> (title, what to notice); names are hyper_parallel.viz.FIGURES
CAPTIONS = {
    "mesh": (
        "Mesh map",
        (
            "Every rank on each parallel dim, coloured by process group: ranks of one colour "
            "communicate on that dim; TP is innermost, so its groups are contiguous ranks."
        ),
    ),
    "placements": (
        "Placement transitions",
        (
            "One parameter through a step: only the FSDP entry changes "
            "(sharded → gathered for compute → resharded); TP/EP entries stay."
        ),
    ),
    "placement_overview": (
        "Placements of every parameter",
        (
            "Each parameter's placements before and after the "
            "all-gather: the FSDP axis differs from the axis "
            "TP/EP shard, where the tensor has one."
        ),
    ),
    "timeline": (
        "Timeline",
        (
            "One step, a row per rank and group: all-gathers in forward, reduce-scatters (then "
            "HSDP's all-reduces) in backward; the gaps between bars are compute."
        ),
    ),
    "comm_volume": (
        "Communication volume against theory",
        (
            "Bytes per op and group against fully_shard's minimum: "
            "×1.00 is optimal, more means padding or an unexpected "
            "collective."
        ),
    ),
    "numerics": (
        "Loss against the reference",
        (
            "The parallel run's loss on top of the single-process "
            "reference: the curves must coincide (differences at fp32 "
            "rounding level)."
        ),
    ),
}
MISSING = {
    "mesh": "the run has no valid degrees",
    "placements": "the traces hold no placement events",
    "placement_overview": "the traces hold no placement events",
    "timeline": "the traces hold no collectives",
    "comm_volume": "the traces hold no collectives",
    "numerics": "no losses were recorded",
}


def figure_block(name: str, fig) -> str:
    """One inlined figure with its caption (what to look for in it)."""
    title, notice = CAPTIONS.get(name, (name.replace("_", " "), ""))
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
        else f"<p class='note' data-missing-figure='{esc(name)}'>{esc(CAPTIONS[name][0])}: not drawn, "
        f"{esc(missing.get(name, MISSING[name]))}.</p>"
        for name in names
    )


def other_figures_section(figures: dict[str, Any]) -> str:
    """Figures ``run_figures`` draws that this page has no place for yet: shown rather than dropped."""
    others = [name for name in figures if name not in CAPTIONS]
    if not others:
        return ""
    return (
        "<section id='other-figures'><h2>Other figures</h2>"
        + "".join(figure_block(name, figures[name]) for name in others)
        + "</section>"
    )
