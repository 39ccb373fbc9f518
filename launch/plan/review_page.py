"""A design review of named layouts (``python -m launch plan --layouts ...``) as text, Markdown, CSV, JSON
or one self-contained HTML page (the run report's stylesheet, the figure inlined as PNG).

Every format carries the same numbers (``cost_model.review.CandidateReview.row``): CSV and JSON the
exact values (bytes, seconds, FLOPs), text and Markdown rounded ones plus a paragraph that says, per
candidate, what bounds its step. Torch is never imported.
"""

from __future__ import annotations

import csv
import datetime
import io
import json

from hyper_parallel.cost_model import ModelConfig
from hyper_parallel.cost_model.assumptions import assumptions
from hyper_parallel.cost_model.hardware import Hardware
from hyper_parallel.cost_model.layouts import GIB
from hyper_parallel.cost_model.review import RESOLUTION, CandidateReview
from hyper_parallel.cost_model.step_time import CRITICAL_GROUPS

FORMATS = ("text", "md", "csv", "json")
SUMMARY_HEADER = (
    "rank",
    "layout",
    "memory GiB",
    "state GiB",
    "gathered GiB",
    "activations GiB",
    "TFLOP/rank",
    "compute s",
    "critical comm s",
    "exposed comm s",
    "hidden comm s",
    "step s (range)",
    "MFU (range)",
    "inter-node GiB/rank",
    "notes",
)


def _notes(review: CandidateReview) -> str:
    notes = (["Pareto"] if review.pareto else []) + (["over budget"] if not review.fits else [])
    return ", ".join(notes) or "-"


def summary_rows(reviews: list[CandidateReview]) -> list[tuple[str, ...]]:
    """One rounded row per candidate, in rank order (the Markdown / text table)."""
    rows = []
    for r in sorted(reviews, key=lambda r: (r.rank, r.step.seconds)):
        m, s = r.cost.memory, r.step
        state = m.parameters + m.gradients + m.optimizer
        rows.append(
            (
                r.rank_text,
                r.label,
                f"{m.total / GIB:.1f}",
                f"{state / GIB:.1f}",
                f"{m.gathered / GIB:.1f}",
                f"{m.activations / GIB:.1f}",
                f"{s.flops.total / 1e12:.0f}",
                f"{s.middle.compute:.2f}",
                f"{s.middle.critical:.2f}",
                f"{s.middle.exposed:.2f}",
                f"{s.middle.hidden:.2f}",
                f"{s.seconds:.2f} ({s.fast.total:.2f}-{s.slow.total:.2f})",
                f"{s.middle.mfu:.0%} ({s.slow.mfu:.0%}-{s.fast.mfu:.0%})",
                f"{s.inter_node_bytes / GIB:.1f}",
                _notes(r),
            )
        )
    return rows


def group_rows(review: CandidateReview) -> list[tuple[str, ...]]:
    """Per (op, group, phase) of one candidate: bytes, whether it crosses nodes, time, and per group how much
    of its time is exposed or hidden (at the middle efficiency)."""
    step = review.step
    rows = []
    for c in step.timed:
        kind = "critical" if c.group in CRITICAL_GROUPS else "overlappable"
        rows.append(
            (
                c.op,
                c.group,
                c.phase,
                kind,
                f"{c.bytes / GIB:.2f}",
                "yes" if c.crosses_nodes else "no",
                f"{c.seconds * 1e3:.1f}",
            )
        )
    return rows


def _by_group(review: CandidateReview) -> str:
    middle = review.step.middle
    return "; ".join(
        f"{g}: exposed {exposed * 1e3:.0f} ms, hidden {middle.hidden_by_group[g] * 1e3:.0f} ms"
        for g, exposed in middle.exposed_by_group.items()
    )


def headline(config: ModelConfig, hardware: Hardware, world_size: int, gpus_per_node: int) -> str:
    nodes = max(1, world_size // gpus_per_node)
    return (
        f"{config.name} on {world_size} ranks ({nodes} nodes x {min(gpus_per_node, world_size)}), {config.describe()}; "
        f"hardware {hardware.describe()}"
    )


def explanation(reviews: list[CandidateReview], hardware: Hardware) -> str:
    """A paragraph a reviewer can paste: the common compute, then per candidate what bounds its step."""
    first = reviews[0].step
    parts = [
        f"The first candidate does {first.flops.total / 1e12:.0f} TFLOP per rank per step in "
        f"{first.middle.compute:.2f} s of compute ({first.fast.compute:.2f}-{first.slow.compute:.2f} s), timed "
        f"from its GEMM shapes, attention and memory-bound work on {hardware.peak_tflops:g} TFLOPS GPUs; "
        "the others' compute differs with their shapes."
    ]
    for r in sorted(reviews, key=lambda r: (r.rank, r.step.seconds)):
        s, m = r.step.middle, r.cost.memory
        hideable = s.exposed + s.hidden
        sentence = (
            f"#{r.rank_text} {r.label}: {r.step.seconds:.2f} s per step, MFU {s.mfu:.0%}, {m.total / GIB:.1f} GiB"
        )
        if not r.fits:
            sentence += f" (over the {hardware.budget_bytes / GIB:.1f} GiB budget)"
        reasons = []
        if s.critical > 0.05 * s.compute:
            reasons.append(f"{s.critical:.2f} s of TP/CP/EP collectives on the critical path")
        if s.exposed > 0.05 * s.compute:
            reasons.append(
                f"{s.exposed:.2f} s of its {hideable:.2f} s of FSDP/HSDP traffic cannot hide behind "
                f"{s.compute:.2f} s of compute ({r.step.inter_node_bytes / GIB:.1f} GiB per rank cross "
                f"nodes at {hardware.inter_node_gbs:g} GB/s)"
            )
        elif hideable > 0:
            reasons.append(
                f"its {hideable:.2f} s of FSDP/HSDP traffic hides behind compute "
                f"({r.step.inter_node_bytes / GIB:.1f} GiB per rank cross nodes)"
            )
        sentence += ": " + "; ".join(reasons) if reasons else ": compute-bound"
        parts.append(sentence + "." + (f" Warnings: {'; '.join(r.warnings)}." if r.warnings else ""))
    if any(r.tied for r in reviews):
        parts.append(
            f"Candidates marked '=' are within {RESOLUTION:.0%} of each other's step time, inside the "
            f"model's resolution: a tie, not an order."
        )
    return " ".join(parts)


def _table_md(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows])


def _table_text(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


GROUP_HEADER = ("op", "group", "phase", "kind", "GiB", "crosses nodes", "ms")


def to_markdown(
    reviews: list[CandidateReview], config: ModelConfig, hardware: Hardware, world_size: int, gpus_per_node: int
) -> str:
    out = [
        f"**{headline(config, hardware, world_size, gpus_per_node)}**",
        "",
        _table_md(SUMMARY_HEADER, summary_rows(reviews)),
        "",
        explanation(reviews, hardware),
        "",
    ]
    for r in reviews:
        out += [f"#### {r.label}", "", _by_group(r) + ".", "", _table_md(GROUP_HEADER, group_rows(r)), ""]
    out += ["#### Assumptions", "", *(f"- {line}" for line in assumptions(config, hardware)), ""]
    return "\n".join(out)


def to_text(
    reviews: list[CandidateReview], config: ModelConfig, hardware: Hardware, world_size: int, gpus_per_node: int
) -> str:
    out = [
        "review: " + headline(config, hardware, world_size, gpus_per_node),
        "",
        _table_text(SUMMARY_HEADER, summary_rows(reviews)),
        "",
        explanation(reviews, hardware),
    ]
    for r in reviews:
        out += ["", f"{r.label}: {_by_group(r)}", _table_text(GROUP_HEADER, group_rows(r))]
    out += ["", "assumptions:", *(f"  - {line}" for line in assumptions(config, hardware))]
    return "\n".join(out)


def to_json(
    reviews: list[CandidateReview], config: ModelConfig, hardware: Hardware, world_size: int, gpus_per_node: int
) -> dict:
    candidates = []
    for r in reviews:
        row = r.row()
        row["collectives"] = [c.__dict__ for c in r.step.timed]
        candidates.append(row)
    return {
        "model": config.name,
        "seq_len": config.seq_len,
        "global_batch": config.global_batch,
        "precision": config.precision.name,
        "world_size": world_size,
        "gpus_per_node": gpus_per_node,
        "hardware": dict(hardware.__dict__),
        "assumptions": assumptions(config, hardware),
        "memory_budget_bytes": hardware.budget_bytes,
        "resolution": RESOLUTION,
        "candidates": candidates,
        "explanation": explanation(reviews, hardware),
    }


def to_csv(reviews: list[CandidateReview], config: ModelConfig | None = None, hardware: Hardware | None = None) -> str:
    """One row per candidate, exact values; per-group seconds as ``exposed_s:GROUP`` / ``hidden_s:GROUP``; the
    last column, ``assumptions``, carries the assumptions and calibration sources (joined by ' | ')."""
    rows = [r.row() for r in reviews]
    notes = " | ".join(assumptions(config, hardware)) if config is not None and hardware is not None else ""
    groups = sorted({g for row in rows for g in row["exposed_by_group_s"]})
    flat = []
    for row in rows:
        exposed, hidden = row.pop("exposed_by_group_s"), row.pop("hidden_by_group_s")
        row["warnings"] = " | ".join(row["warnings"])
        row |= {f"exposed_s:{g}": exposed.get(g, 0.0) for g in groups}
        row |= {f"hidden_s:{g}": hidden.get(g, 0.0) for g in groups}
        row["stage_memory_bytes"] = " ".join(str(b) for b in row["stage_memory_bytes"])
        row["assumptions"] = notes
        flat.append(row)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(flat[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    return buffer.getvalue()


def render(
    fmt: str,
    reviews: list[CandidateReview],
    config: ModelConfig,
    hardware: Hardware,
    world_size: int,
    gpus_per_node: int,
) -> str:
    if fmt == "csv":
        return to_csv(reviews, config, hardware)
    if fmt == "json":
        return json.dumps(to_json(reviews, config, hardware, world_size, gpus_per_node), indent=1)
    writer = {"md": to_markdown, "text": to_text}[fmt]
    return writer(reviews, config, hardware, world_size, gpus_per_node)


def to_html(
    reviews: list[CandidateReview],
    config: ModelConfig,
    hardware: Hardware,
    world_size: int,
    gpus_per_node: int,
    command: str = "",
) -> str:
    """One page: headline, the comparison figure, the summary table, the paragraph, a table per candidate."""
    from hyper_parallel.viz.planning import review_figure
    from launch.report.markup import esc, png_data_uri
    from launch.report.style import STYLESHEET

    def table(header, rows, numeric_from=2):
        head = "".join(f"<th>{esc(h)}</th>" for h in header)
        body = "".join(
            "<tr>"
            + "".join(f"<td{' class=num' if i >= numeric_from else ''}>{esc(c)}</td>" for i, c in enumerate(row))
            + "</tr>"
            for row in rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    figure = review_figure(reviews, hardware.budget_bytes)
    image = png_data_uri(figure)
    sections = []
    for r in reviews:
        warnings = "".join(f"<li>{esc(w)}</li>" for w in r.warnings)
        memory = table(("part", "GiB"), [(k, f"{v / GIB:.2f}") for k, v in r.cost.memory.as_dict().items()], 1)
        sections.append(
            f"<section><h3>#{esc(r.rank_text)} {esc(r.label)}</h3>"
            + (f"<ul class='fail'>{warnings}</ul>" if warnings else "")
            + f"<p class='note'>{esc(_by_group(r))}</p>{memory}"
            + table(GROUP_HEADER, group_rows(r), 4)
            + "</section>"
        )
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Design review: {esc(config.name)} on {world_size} ranks</title>
<style>{STYLESHEET}</style></head><body>
<header class="ok"><div class="inner"><span class="verdict">DESIGN REVIEW</span>
<h1>{esc(config.name)} on {world_size} ranks: {len(reviews)} candidates</h1>
<p class="meta">{esc(headline(config, hardware, world_size, gpus_per_node))}</p></div></header>
<main>
<section><h2>Comparison</h2>{table(SUMMARY_HEADER, summary_rows(reviews))}
<p>{esc(explanation(reviews, hardware))}</p>
<figure><img alt="step time against memory per candidate" src="{image}"><figcaption><b>Candidates.</b> Step time
(the bar: the step's range, +-{hardware.band:.0%} of its compute) against memory per rank;
the green line joins the Pareto front within the budget.</figcaption></figure></section>
<section><h2>Per candidate</h2>{"".join(sections)}</section>
<section><h2>Model</h2><p class="note">FLOPs: hyper_parallel.cost_model.compute; overlap and step time:
hyper_parallel.cost_model.step_time; memory: hyper_parallel.cost_model.memory (sharded state exact, activations
estimated); bytes per collective: hyper_parallel.cost_model.communication.</p>
<ul>{"".join(f"<li>{esc(line)}</li>" for line in assumptions(config, hardware))}</ul>
<pre>{esc(command)}</pre></section>
</main><footer>generated {stamp} by python -m launch plan --layouts</footer></body></html>
"""
