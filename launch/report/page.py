"""The report as one HTML string: header, error, run facts, numerics, figures, folded logs.

Every piece of text from a run (logs, errors, recipe text, paths) goes through ``esc``: a log can
hold anything, including markup. Figures are the ``hyper_parallel.viz`` ones, inlined as base64
PNG, so the page needs no other file and no network. Numbers carry their exact value in a
``data-value`` attribute next to the rounded text a reader sees (tests and scripts read those).

This module lays the page out and writes the run's own sections (header, error, run, numerics,
communication table); the shared markup is ``markup``, the figures ``figure_blocks``, the logs
``log_section``.
"""

from __future__ import annotations

import datetime
from typing import Any

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import DEGREE_KEYS, DEGREE_NAMES, active_degrees
from launch.report.figure_blocks import figure_blocks, other_figures_section
from launch.report.log_section import logs_section
from launch.report.markup import esc, facts_table, num_cell
from launch.report.run_data import RunData
from launch.report.style import PRINT_SCRIPT, STYLESHEET

SECTIONS = (
    ("summary", "Summary"),
    ("run", "Run"),
    ("numerics", "Numerics"),
    ("mesh", "Mesh"),
    ("placements", "Placements"),
    ("timeline", "Timeline"),
    ("volume", "Communication"),
    ("logs", "Logs"),
)


def rerun_command(run: RunData) -> str:
    degrees = run.degrees
    parts = ["python -m launch run", run.recipe_name or "RECIPE", f"--world {degrees.get('world_size', '?')}"]
    parts += [f"--{name.replace('_', '-')} {value}" for name, value in active_degrees(degrees).items()]
    steps = run.value("steps") or len(run.value("losses") or []) or None
    parts += [f"--steps {steps}"] if steps else []
    parts += [f"--seed {run.value('seed')}"] if run.value("seed") not in (None, 0) else []
    return " ".join(parts)


def _header(run: RunData) -> str:
    recipe = run.recipe
    name = run.recipe_name or "unknown recipe"
    heading = f"{name} — {recipe.title}" if recipe else name
    degrees = run.degrees
    world = esc(degrees.get("world_size", "?"))
    chips = [f"<span class='chip active' data-degree='world_size'>world_size {world}</span>"]
    chips += [
        f"<span class='chip{' active' if degrees.get(n, 1) != 1 else ''}' data-degree='{n}'>"
        f"{n} {esc(degrees[n])}</span>"
        for n in DEGREE_NAMES
        if n in degrees
    ]
    verdict = (
        "PASSED · matches the single-process reference"
        if run.ok
        else run.verdict + (f" · rank {run.failed_rank}" if run.failed_rank is not None else "")
    )
    meta = [f"run directory <code>{esc(run.run_dir)}</code>"]
    if run.finished_at:
        meta.append(f"finished {run.finished_at:%Y-%m-%d %H:%M:%S}")
    if isinstance(run.summary.get("duration"), (int, float)):
        meta.append(f"{run.summary['duration']:.1f} s")
    meta += [f"backend {esc(run.metrics['backend'])}"] if run.metrics.get("backend") else []
    return (
        f"<header class='{'ok' if run.ok else 'failed'}'><div class='inner'>"
        f"<span class='verdict' id='verdict' data-ok='{str(run.ok).lower()}'>{esc(verdict)}</span>"
        f"<h1>{esc(heading)}</h1><div class='degrees'>{''.join(chips)}</div>"
        f"<p class='meta'>{' · '.join(meta)}</p></div></header>"
    )


def _error(run: RunData) -> str:
    if not run.error:
        return ""
    where = (
        f" Rank {run.failed_rank}'s log is marked in <a href='#logs'>Logs</a>."
        if run.failed_rank is not None
        else " The per-rank output is in <a href='#logs'>Logs</a>."
    )
    return (
        f"<section id='error'><h2>What went wrong</h2><p class='lead'>The launcher's message "
        f"(return code {esc(run.summary.get('returncode', '?'))}).{where}</p>"
        f"<pre class='error'>{esc(run.error)}</pre></section>"
    )


def pipeline_bubble(run: RunData) -> str | None:
    """A pipeline run's measured bubble (the ranks' mean idle share of the last step, from the traces)
    beside its schedule's formula; None for other runs or when the traces hold no pipeline actions."""
    notes = run.value("notes") or {}
    if "schedule" not in notes or not run.trace_ranks:
        return None
    from hyper_parallel.run_files import load_traces
    from hyper_parallel.viz.pipeline import formula_text, measured_bubble

    traces = load_traces(run.run_dir)
    steps = [e["step"] for events in traces.values() for e in events if e.get("kind") == "pipeline"]
    if not steps:
        return None
    idle = measured_bubble(traces, max(steps))
    mean = sum(idle.values()) / len(idle)
    pp = int(run.degrees.get("pp", 1))
    formula = formula_text(notes["schedule"], pp, notes["microbatches"], notes["stages_per_rank"])
    return (
        f"{notes['schedule']}: {mean:.0%} measured (mean idle share of the {len(idle)} ranks' last step) "
        f"against the formula's {formula}; on shared CPU cores the ranks' compute does not run in parallel, "
        "so the measured share is not the formula's"
    )


def _run_section(run: RunData) -> str:
    recipe, degrees = run.recipe, run.degrees
    rows = []
    if recipe is not None:
        cells = "".join(f"<td>{esc(cell.strip())}</td>" for cell in recipe.matrix_row.split("|"))
        rows += [
            ("recipe", f"<b>{esc(recipe.name)}</b> — {esc(recipe.title)}"),
            ("what", esc(recipe.description)),
            ("matrix row (docs/design.md §4)", f"<table class='matrix'><tr>{cells}</tr></table>"),
            ("recipe constraints", esc(recipe.constraints() or "none beyond the mesh rules")),
            ("CI tier", esc(recipe.tier or "-")),
        ]
    else:
        rows.append(("recipe", esc(f"{run.recipe_name or '?'} (not in the recipe registry of this checkout)")))
    head = "".join(f"<th>{n}</th>" for n in DEGREE_KEYS if n in degrees)
    body = "".join(f"<td class='num' data-degree='{n}'>{esc(degrees[n])}</td>" for n in DEGREE_KEYS if n in degrees)
    rows.append(
        (
            "degrees",
            f"<table id='degrees'><thead><tr>{head}</tr></thead><tbody><tr>{body}</tr></tbody></table>"
            if degrees
            else "<span class='note'>not recorded</span>",
        )
    )
    try:
        views = ParallelDims(**{k: v for k, v in degrees.items() if k in DEGREE_KEYS}).describe()
        rows.append(("mesh views", f"<pre>{esc(views)}</pre>"))
    except (TypeError, ValueError) as error:
        rows.append(("mesh views", f"<span class='note'>cannot rebuild the mesh: {esc(error)}</span>"))
    for key in ("steps", "seed", "backend"):
        if run.value(key) is not None:
            rows.append((key, esc(run.value(key))))
    bubble = pipeline_bubble(run)
    if bubble:
        rows.append(("pipeline bubble", esc(bubble)))
    rows.append(("same run from a terminal", f"<code>{esc(rerun_command(run))}</code>"))
    if run.chrome_traces:
        rows.append(
            (
                "interactive timeline",
                "open <code>"
                + "</code>, <code>".join(map(esc, run.chrome_traces))
                + "</code> from the run directory in Perfetto (ui.perfetto.dev) or chrome://tracing",
            )
        )
    return f"<section id='run'><h2>Run</h2>{facts_table(rows)}</section>"


def _numerics_section(run: RunData, figures: dict[str, Any], missing: dict[str, str], download: str = "") -> str:
    losses, reference = run.value("losses") or [], run.value("reference_losses") or []
    times = run.value("step_times") or []
    parts = ["<section id='numerics'><h2>Numerics against the single-process reference</h2>"]
    if losses:
        verdict = "<span class='pass'>match</span>" if run.ok else "<span class='fail'>do not match</span>"
        steps = f"{len(losses)} step{'s' * (len(losses) != 1)}"
        parts.append(
            f"<p class='lead'>Losses of {steps} and the parameters after the last step, "
            f"compared with one process training on the global batch: {verdict}.</p>"
        )
    else:
        parts.append("<p class='lead'>No losses were recorded: the workers did not finish a training step.</p>")
    rows = []
    for step in range(max(len(losses), len(reference))):
        loss = losses[step] if step < len(losses) else None
        ref = reference[step] if step < len(reference) else None
        diff = abs(loss - ref) if loss is not None and ref is not None else None
        rows.append(
            f"<tr><td class='num'>{step}</td>{num_cell(loss, '.8f', 'loss', step)}"
            f"{num_cell(ref, '.8f', 'reference_loss', step)}{num_cell(diff, '.2e', 'difference', step)}"
            f"{num_cell(times[step] if step < len(times) else None, '.3f', 'step_time', step)}</tr>"
        )
    if rows:
        parts.append(
            "<table id='losses'><thead><tr><th>step</th><th>loss</th><th>reference loss</th>"
            "<th>|difference|</th><th>step time (s)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        )
    mismatched = run.value("mismatched_params") or []
    summary = [
        ("max |loss − reference| over all steps", num_cell(run.value("max_abs_diff"), ".3e", "max_abs_diff")),
        (
            "max |parameter − reference| after the last step",
            num_cell(run.value("max_param_diff"), ".3e", "max_param_diff"),
        ),
        ("parameters off the reference", f"<td>{esc(', '.join(mismatched) or 'none')}</td>"),
    ]
    bad_row = " class='bad'" if mismatched else ""
    parts.append(
        "<table id='numbers'>"
        + "".join(
            f"<tr{bad_row if k.startswith('parameters') else ''}><th>{esc(k)}</th>{cell}</tr>" for k, cell in summary
        )
        + "</table>"
    )
    notes = run.value("notes") or {}
    if notes:
        parts.append(facts_table((str(k), esc(v)) for k, v in notes.items()))
    parts.append(download)
    parts.append(figure_blocks(["numerics"], figures, missing))
    return "".join(parts) + "</section>"


def _volume_table(volume: list[dict] | None) -> str:
    if not volume:
        return ""

    def ratio(a, b):
        return a / b if isinstance(a, (int, float)) and b else None

    rows = "".join(
        f"<tr><td>{esc(row['op'])}</td><td>{esc(row['group'])}</td><td class='num'>{row['calls']}</td>"
        f"{num_cell(row['measured'], ',.0f', 'measured_bytes')}{num_cell(row.get('predicted'), ',.0f', 'predicted_bytes')}"
        f"{num_cell(ratio(row['measured'], row.get('predicted')), '.2f', 'predicted_ratio')}"
        f"{num_cell(row['minimum'], ',.0f', 'minimum_bytes')}"
        f"{num_cell(ratio(row['measured'], row['minimum']), '.2f', 'ratio')}</tr>"
        for row in volume
    )
    return (
        "<table id='volume-table'><thead><tr><th>op</th><th>group</th><th>calls</th><th>measured bytes</th>"
        "<th>cost model</th><th>measured / model</th><th>fully_shard's minimum</th><th>measured / minimum</th>"
        "</tr></thead><tbody>" + rows + "</tbody></table>"
        "<p class='note'>Rank 0, last step, sums of full buffers, both phases. The cost model "
        "(<code>hyper_parallel.cost_model.estimate</code>) predicts every collective, padding and TP/CP/EP "
        "included; EP's all-to-all and ETP's all-reduce are its balanced value (rank 0 receives what the routing "
        "sends it). fully_shard's minimum covers FSDP/HSDP only, without padding (–: not an FSDP collective).</p>"
    )


def render_page(
    run: RunData,
    figures: dict[str, Any],
    *,
    missing: dict[str, str] | None = None,
    volume: list[dict] | None = None,
    summary: str = "",
    downloads: dict[str, str] | None = None,
) -> str:
    """The whole report. ``figures``: name -> Figure (``run_figures``); ``missing``: name -> why it was
    not drawn (overrides the default reason); ``volume``: rows of the communication table; ``summary``: the
    first screen (``launch.report.summary``); ``downloads``: section -> CSV links shown under its table."""
    missing = missing or {}
    downloads = downloads or {}
    recipe = run.recipe_name or "run"
    nav = "".join(f"<a href='#{anchor}'>{esc(label)}</a>" for anchor, label in SECTIONS)
    body = [
        _header(run),
        f"<nav>{nav}</nav><main>",
        summary,
        _error(run),
        _run_section(run),
        _numerics_section(run, figures, missing, downloads.get("numerics", "")),
        "<section id='mesh'><h2>Mesh</h2>",
        figure_blocks(["mesh"], figures, missing),
        "</section>",
        "<section id='placements'><h2>Placement transitions</h2>",
        figure_blocks(["placements", "placement_overview"], figures, missing),
        "</section>",
        "<section id='timeline'><h2>Timeline of collectives</h2>",
        figure_blocks(["timeline"], figures, missing),
        "</section>",
        "<section id='volume'><h2>Communication volume against theory</h2>",
        figure_blocks(["comm_volume"], figures, missing),
        _volume_table(volume),
        downloads.get("volume", ""),
        "</section>",
        other_figures_section(figures),
        logs_section(run),
        "</main>",
        (
            f"<footer>Written by <code>python -m launch report</code> on {datetime.datetime.now():%Y-%m-%d %H:%M:%S}. "
            "Self-contained: the figures are inlined PNG images, nothing is fetched from the network.</footer>"
        ),
    ]
    title = f"{recipe} · {run.verdict} · hyper-parallel run report"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)}</title><style>{STYLESHEET}</style></head><body>"
        + "".join(body)
        + f"<script>{PRINT_SCRIPT}</script></body></html>\n"
    )
