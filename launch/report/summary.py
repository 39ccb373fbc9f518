"""The report's first screen and its downloadable tables.

summary_section   verdict, recipe, degrees, numerics, step time, communication measured against the cost
                  model, and the same layout at scale: what a reader needs before scrolling
csv_link          a table as a ``data:text/csv`` download link, so the page stays one self-contained file
"""

from __future__ import annotations

import base64
import csv
import io
from collections.abc import Iterable

from hyper_parallel.mesh_dims import degrees_label
from launch.report.markup import esc
from launch.report.predicted import AtScale, at_scale_sentence
from launch.report.run_data import RunData


def csv_text(header: Iterable[str], rows: Iterable[Iterable]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(list(header))
    writer.writerows([list(row) for row in rows])
    return buffer.getvalue()


def csv_link(filename: str, header: Iterable[str], rows: Iterable[Iterable]) -> str:
    data = base64.b64encode(csv_text(header, rows).encode("utf-8")).decode("ascii")
    return (
        f"<p class='note'><a download='{esc(filename)}' data-csv='{esc(filename)}' "
        f"href='data:text/csv;base64,{data}'>download {esc(filename)}</a></p>"
    )


def volume_csv(volume: list[dict] | None) -> str:
    if not volume:
        return ""
    keys = ("op", "group", "calls", "measured", "predicted", "minimum")
    return csv_link(
        "communication.csv",
        ("op", "group", "calls", "measured_bytes", "cost_model_bytes", "fully_shard_minimum_bytes"),
        [[row.get(k) if row.get(k) is not None else "" for k in keys] for row in volume],
    )


def losses_csv(run: RunData) -> str:
    losses, reference = run.value("losses") or [], run.value("reference_losses") or []
    times = run.value("step_times") or []
    if not losses:
        return ""
    rows = [
        [step, loss, reference[step] if step < len(reference) else "", times[step] if step < len(times) else ""]
        for step, loss in enumerate(losses)
    ]
    return csv_link("losses.csv", ("step", "loss", "reference_loss", "step_time_s"), rows)


def communication_check(volume: list[dict] | None) -> str:
    """'measured = cost model on every collective', or the ones that differ."""
    if not volume:
        return "no traced collectives"
    compared = [row for row in volume if row.get("predicted") is not None and row.get("measured") is not None]
    differ = [f"{row['op']} {row['group']}" for row in compared if row["measured"] != row["predicted"]]
    unmodelled = [f"{row['op']} {row['group']}" for row in volume if row.get("predicted") is None]
    text = (
        f"{len(compared) - len(differ)} of {len(volume)} (op, group) totals on rank 0 equal the cost model's bytes"
        + (f"; differ: {', '.join(differ)}" if differ else "")
        + (f"; not in the model: {', '.join(unmodelled)}" if unmodelled else "")
    )
    return text


def summary_section(run: RunData, volume: list[dict] | None, scaled: AtScale | None) -> str:
    verdict = (
        "<span class='pass'>PASSED</span>: losses and parameters match the single-process reference"
        if run.ok
        else "<span class='fail'>FAILED</span>" + (f": {esc(run.error.splitlines()[0])}" if run.error else "")
    )
    recipe = run.recipe
    times = run.value("step_times") or []
    rows = [
        ("verdict", verdict),
        ("recipe", esc(f"{run.recipe_name or '?'}" + (f": {recipe.title}" if recipe else ""))),
        ("degrees", esc(degrees_label(run.degrees, world=True))),
        (
            "max |loss - reference|",
            esc(f"{run.value('max_abs_diff'):.2e}") if isinstance(run.value("max_abs_diff"), (int, float)) else "–",
        ),
        (
            "step time (CPU, gloo)",
            esc(f"{sum(times) / len(times):.3f} s mean over {len(times)} steps") if times else "–",
        ),
        ("communication", esc(communication_check(volume))),
        (
            "this layout at scale",
            esc(at_scale_sentence(scaled)) + f"<br><code>{esc(scaled.command)}</code>"
            if scaled
            else "<span class='note'>the cost model does not describe this recipe</span>",
        ),
    ]
    table = (
        "<table class='facts' id='summary-table'>"
        + "".join(f"<tr><th>{esc(k)}</th><td data-summary='{esc(k)}'>{v}</td></tr>" for k, v in rows)
        + "</table>"
    )
    return f"<section id='summary'><h2>Summary</h2>{table}</section>"
