"""The report as one HTML string: header, error, run facts, numerics, figures, folded logs.

Every piece of text from a run (logs, errors, recipe text, paths) goes through ``esc``: a log can
hold anything, including markup. Figures are the ``hyper_parallel.viz`` ones, inlined as base64
PNG, so the page needs no other file and no network. Numbers carry their exact value in a
``data-value`` attribute next to the rounded text a reader sees (tests and scripts read those).
"""

from __future__ import annotations

import base64
import datetime
import html
import io
from collections.abc import Iterable
from typing import Any

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import DEGREE_NAMES
from launch.report.run_data import LogFile, RunData
from launch.report.style import PRINT_SCRIPT, STYLESHEET

DEGREE_ORDER = ("world_size", *DEGREE_NAMES)
FIGURE_DPI = 110

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


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def png_data_uri(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=FIGURE_DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def num_cell(value: Any, spec: str, key: str, step: int | None = None) -> str:
    """A right-aligned number: rounded text, exact ``repr`` in ``data-value``; "–" when missing."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"<td class='num' data-key='{esc(key)}'>–</td>"
    step_attr = f" data-step='{step}'" if step is not None else ""
    return f"<td class='num' data-key='{esc(key)}'{step_attr} data-value='{value!r}'>{value:{spec}}</td>"


def degrees_text(degrees: dict[str, int]) -> str:
    active = [f"{name}={degrees[name]}" for name in DEGREE_ORDER[1:] if degrees.get(name, 1) != 1]
    return f"world_size={degrees.get('world_size', '?')}" + (": " + ", ".join(active) if active else "")


def rerun_command(run: RunData) -> str:
    degrees = run.degrees
    parts = ["python -m launch run", run.recipe_name or "RECIPE", f"--world {degrees.get('world_size', '?')}"]
    parts += [f"--{name.replace('_', '-')} {degrees[name]}" for name in DEGREE_ORDER[1:] if degrees.get(name, 1) != 1]
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
        for n in DEGREE_ORDER[1:]
        if n in degrees
    ]
    verdict = (
        "PASSED · matches the single-process reference"
        if run.ok
        else "FAILED" + (f" · rank {run.failed_rank}" if run.failed_rank is not None else "")
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


def _facts_table(rows: Iterable[tuple[str, str]]) -> str:
    """Rows of (label, already-escaped HTML)."""
    return "<table class='facts'>" + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


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
    head = "".join(f"<th>{n}</th>" for n in DEGREE_ORDER if n in degrees)
    body = "".join(f"<td class='num' data-degree='{n}'>{esc(degrees[n])}</td>" for n in DEGREE_ORDER if n in degrees)
    rows.append(
        (
            "degrees",
            f"<table id='degrees'><thead><tr>{head}</tr></thead><tbody><tr>{body}</tr></tbody></table>"
            if degrees
            else "<span class='note'>not recorded</span>",
        )
    )
    try:
        views = ParallelDims(**{k: v for k, v in degrees.items() if k in DEGREE_ORDER}).describe()
        rows.append(("mesh views", f"<pre>{esc(views)}</pre>"))
    except (TypeError, ValueError) as error:
        rows.append(("mesh views", f"<span class='note'>cannot rebuild the mesh: {esc(error)}</span>"))
    for key in ("steps", "seed", "backend"):
        if run.value(key) is not None:
            rows.append((key, esc(run.value(key))))
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
    return f"<section id='run'><h2>Run</h2>{_facts_table(rows)}</section>"


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
        parts.append(_facts_table((str(k), esc(v)) for k, v in notes.items()))
    parts.append(download)
    parts.append(_figures(["numerics"], figures, missing))
    return "".join(parts) + "</section>"


def _figure(name: str, fig) -> str:
    title, notice = CAPTIONS.get(name, (name.replace("_", " "), ""))
    return (
        f"<figure id='figure-{esc(name)}' data-figure='{esc(name)}'>"
        f"<img src='{png_data_uri(fig)}' alt='{esc(title)}'>"
        f"<figcaption><b>{esc(title)}.</b> {esc(notice)}</figcaption></figure>"
    )


def _figures(names: list[str], figures: dict[str, Any], missing: dict[str, str]) -> str:
    return "".join(
        _figure(name, figures[name])
        if name in figures
        else f"<p class='note' data-missing-figure='{esc(name)}'>{esc(CAPTIONS[name][0])}: not drawn, "
        f"{esc(missing.get(name, MISSING[name]))}.</p>"
        for name in names
    )


def _other_figures(figures: dict[str, Any]) -> str:
    """Figures ``run_figures`` draws that this page has no place for yet: shown rather than dropped."""
    others = [name for name in figures if name not in CAPTIONS]
    if not others:
        return ""
    return (
        "<section id='other-figures'><h2>Other figures</h2>"
        + "".join(_figure(name, figures[name]) for name in others)
        + "</section>"
    )


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


def _log_block(log: LogFile) -> str:
    name = "torchrun's output" if log.rank < 0 else log.stream + (".log" if log.path else "")
    cut = (
        (
            f"<p class='note'>the first {log.omitted} lines are not shown"
            + (f"; the whole file: <code>{esc(log.path)}</code>" if log.path else "")
            + "</p>"
        )
        if log.omitted
        else ""
    )
    body = f"<pre>{esc(chr(10).join(log.lines))}</pre>" if log.lines else "<p class='note'>(empty)</p>"
    return f"<h3>{esc(name)}</h3>{cut}{body}"


def _logs_section(run: RunData) -> str:
    parts = ["<section id='logs'><h2>Logs</h2>"]
    if not run.logs:
        parts.append(
            "<p class='note'>No per-rank log files were found (torchrun_logs_* in the run directory, or next "
            "to batch.json in its parent for runs that shared a launch).</p></section>"
        )
        return "".join(parts)
    source = run.logs[0].path.parents[3] if run.logs[0].path else None
    shared = source is not None and source.parent != run.run_dir
    parts.append(
        "<p class='lead'>Every rank's output, folded; click a rank to open it"
        + (f". Files under <code>{esc(source)}</code>" if source else "")
        + ("; this launch ran several runs one after another, and its logs hold all of them" if shared else "")
        + ".</p>"
    )
    by_rank: dict[int, list[LogFile]] = {}
    for log in run.logs:
        by_rank.setdefault(log.rank, []).append(log)
    for rank, logs in by_rank.items():
        failed = rank == run.failed_rank
        counts = ", ".join(f"{log.stream} {len(log.lines) + log.omitted} lines" for log in logs)
        label = ("torchrun" if rank < 0 else f"rank {rank}") + f" · {counts}" + (" · FAILED" if failed else "")
        parts.append(
            f"<details class='log{' failed' if failed else ''}' data-rank='{rank}'><summary>{esc(label)}"
            f"</summary><div>{''.join(_log_block(log) for log in logs)}</div></details>"
        )
    return "".join(parts) + "</section>"


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
        _figures(["mesh"], figures, missing),
        "</section>",
        "<section id='placements'><h2>Placement transitions</h2>",
        _figures(["placements", "placement_overview"], figures, missing),
        "</section>",
        "<section id='timeline'><h2>Timeline of collectives</h2>",
        _figures(["timeline"], figures, missing),
        "</section>",
        "<section id='volume'><h2>Communication volume against theory</h2>",
        _figures(["comm_volume"], figures, missing),
        _volume_table(volume),
        downloads.get("volume", ""),
        "</section>",
        _other_figures(figures),
        _logs_section(run),
        "</main>",
        (
            f"<footer>Written by <code>python -m launch report</code> on {datetime.datetime.now():%Y-%m-%d %H:%M:%S}. "
            "Self-contained: the figures are inlined PNG images, nothing is fetched from the network.</footer>"
        ),
    ]
    title = f"{recipe} · {'PASSED' if run.ok else 'FAILED'} · hyper-parallel run report"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)}</title><style>{STYLESHEET}</style></head><body>"
        + "".join(body)
        + f"<script>{PRINT_SCRIPT}</script></body></html>\n"
    )
