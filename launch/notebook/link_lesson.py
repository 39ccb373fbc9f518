"""Overlap on an emulated link (``hyper_parallel.link``): each run's step time and exposed communication
against the α-β model's (``hyper_parallel.cost_model.emulated``).

    link_runs(m4)                   the runs to compare: M4 (or another recipe) with overlap off and on, on the link
    link_overlap_rows(results)      per run: measured step and exposed communication (rank 0, its fastest
                                    step after the first) beside the model's, and their ratios
    link_overlap_table(results)     the same as a table
    link_overlap_summary(results)   one sentence: what overlap saved, measured and modelled

Exposed communication is measured as the time the training thread waited for the link (synchronous
collectives whole, asynchronous ones from their wait: ``viz.overlap.step_waiting``), not as everything in
flight outside compute: fully_shard's hooks running while a collective travels take that time anyway. The
first step is left out: fully_shard records the order of the units in it and prefetches from the second
step on. Of the others the fastest is compared: on 2 shared cores a rank descheduled mid-step makes its
peer wait in a collective, time neither the link nor overlap is about. The compute and the rest of the
step (hooks, the optimizer) are measured; the model adds the link's time and what overlap hides of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LINK = "notebook"
"""The lesson's link (``hyper_parallel.link.LINK_PRESETS``): α 2 ms, 1 MB/s, scaled to the MLP's blocks."""
GLOBAL_BATCH = 4096
"""Rows per step: enough that a block's backward computes about as long as its transfer takes on the link
(with the default 16 rows the compute is a few hundred microseconds and there is nothing to hide behind)."""


def link_runs(
    degrees: Mapping[str, int], link: str = LINK, global_batch: int = GLOBAL_BATCH, recipe: str = "M4"
) -> dict[str, dict]:
    """``run_recipes``' runs of the lesson: ``recipe`` (01's M4, 05's M7) on ``degrees`` over the emulated
    ``link``, every collective on the spot ("<recipe>-link-sync") and with prefetch and reduce-scatters in
    flight ("<recipe>-link")."""
    base = {"recipe": recipe, **degrees, "global_batch": global_batch, "link": link}
    return {f"{recipe}-link-sync": {**base, "overlap": False}, f"{recipe}-link": {**base, "overlap": True}}


def _fastest_step(result: Any) -> dict[str, Any]:
    """Rank 0's measured numbers in its fastest step after the first: the step least disturbed by other
    processes on the shared cores (a rank descheduled mid-step makes its peers wait in their collectives).
    ``waited``: the training thread blocked on communication (``viz.overlap.step_waiting``); ``other``: the
    step's time neither computing nor waiting (hooks, the optimizer)."""
    from hyper_parallel.viz.overlap import compute_by_phase, step_waiting

    step_times = result.metrics["step_times"]
    later = range(1, len(step_times)) if len(step_times) > 1 else range(len(step_times))
    step = min(later, key=lambda s: step_times[s])
    events = result.traces[0]
    phases = compute_by_phase(events, step)
    compute = {phase: phases.get(phase, 0.0) for phase in ("forward", "backward")}
    waited = step_waiting(events, step)
    return {
        "index": step,
        "step": step_times[step],
        "waited": waited,
        "compute": compute,
        "other": step_times[step] - sum(compute.values()) - waited,
    }


def link_overlap_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per run that waited on an emulated link (the others are skipped): label, link, overlap,
    measured and modelled step time and exposed communication (seconds: the time the training thread waited
    for the link), and model / measured."""
    from hyper_parallel.cost_model.emulated import emulated_step
    from hyper_parallel.link import Link

    rows = []
    for label, result in results.items():
        link = Link.from_json(result.metrics.get("link"))
        if link is None:
            continue
        measured = _fastest_step(result)
        model = emulated_step(
            result.recipe,
            result.metrics.get("options"),
            result.dims,
            link,
            overlap=bool(result.metrics.get("overlap")),
            compute=measured["compute"],
            other=measured["other"],
        )
        rows.append(
            {
                "run": label,
                "link": link,
                "overlap": bool(result.metrics.get("overlap")),
                "step": measured["step"],
                "model_step": model.total,
                "exposed": measured["waited"],
                "model_exposed": model.exposed,
                "index": measured["index"],
                "model_communication": model.communication,
                "compute": sum(measured["compute"].values()),
            }
        )
    return rows


def link_overlap_table(results: Mapping[str, Any]):
    """``link_overlap_rows`` as a table (milliseconds)."""
    from launch.tables import table

    rows = [
        [
            row["run"],
            "on" if row["overlap"] else "off",
            f"{row['compute'] * 1e3:.1f}",
            f"{row['model_communication'] * 1e3:.1f}",
            f"{row['exposed'] * 1e3:.1f} / {row['model_exposed'] * 1e3:.1f}",
            f"{row['step'] * 1e3:.1f} / {row['model_step'] * 1e3:.1f}",
            f"{row['model_step'] / row['step']:.2f}",
        ]
        for row in link_overlap_rows(results)
    ]
    link = next((row["link"] for row in link_overlap_rows(results)), None)
    return table(
        [
            "run",
            "overlap",
            "compute ms",
            "link time ms (model: α + n·β summed)",
            "waited for the link ms, measured / model",
            "step ms, measured / model",
            "model / measured step",
        ],
        rows,
        caption=f"rank 0, its fastest step after the first; {link.describe() if link else 'no emulated link'}",
    )


def link_overlap_summary(results: Mapping[str, Any]) -> str:
    """What overlap saved on the link, measured and as the model has it (the runs without overlap and with
    it, ``link_runs``); '' unless both are there."""
    rows = {row["overlap"]: row for row in link_overlap_rows(results)}
    if set(rows) != {False, True}:
        return ""
    off, on = rows[False], rows[True]
    return (
        f"overlap saved {(off['step'] - on['step']) * 1e3:.1f} ms of the {off['step'] * 1e3:.1f} ms step "
        f"({1 - on['step'] / off['step']:.0%}); the model: {(off['model_step'] - on['model_step']) * 1e3:.1f} ms "
        f"of {off['model_step'] * 1e3:.1f} ms ({1 - on['model_step'] / off['model_step']:.0%}). Waiting for the "
        f"link: {off['exposed'] * 1e3:.1f} -> {on['exposed'] * 1e3:.1f} ms measured, "
        f"{off['model_exposed'] * 1e3:.1f} -> {on['model_exposed'] * 1e3:.1f} ms modelled."
    )


def link_overlap_figure(results: Mapping[str, Any]):
    """Each run's step as stacked bars, measured above modelled: compute, the rest (hooks, the optimizer) and
    the time waited for the link; the title names the emulated link."""
    from hyper_parallel.viz.style import new_figure

    rows = link_overlap_rows(results)
    fig = new_figure(10, 1.2 + 0.7 * len(rows))
    ax = fig.add_subplot()
    labels, y = [], 0
    for row in rows:
        for kind, exposed in (("measured", row["exposed"]), ("model", row["model_exposed"])):
            other = row["step"] - row["compute"] - row["exposed"]
            left = 0.0
            for part, seconds, color in (
                ("compute", row["compute"], "#455a64"),
                ("hooks, optimizer", other, "#b0bec5"),
                ("waited for the link", exposed, "#e65100"),
            ):
                ax.barh(y, seconds * 1e3, left=left, color=color, label=part if y == 0 else None)
                left += seconds * 1e3
            ax.text(left, y, f" {left:.0f} ms", va="center", fontsize=8)
            labels.append(f"{row['run']} ({'overlap' if row['overlap'] else 'sync'}), {kind}")
            y += 1
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms of the step (rank 0, its fastest step after the first)")
    ax.legend(loc="lower right", fontsize=8)
    link = rows[0]["link"].describe() if rows else "no emulated link"
    fig.suptitle(f"Step time on the link, measured and α-β model — {link}", fontsize=10)
    return fig
