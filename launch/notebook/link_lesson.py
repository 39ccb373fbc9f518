"""Overlap on an emulated link (``hyper_parallel.link``): each run's step time and exposed communication
against the α-β model's (``hyper_parallel.cost_model.emulated``).

    link_overlap_rows(results)      per run: measured step and exposed communication (rank 0, its fastest
                                    step after the first) beside the model's, and their ratios
    link_overlap_table(results)     the same as a table

The first step is left out: fully_shard records the order of the units in it and prefetches from the
second step on. Of the others the fastest is compared: on 2 shared cores a rank descheduled mid-step
makes its peer wait in a collective, time neither the link nor overlap is about. The compute and the rest of the step (hooks, the optimizer) are measured; the model adds
the link's time and what overlap hides of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _fastest_step(result: Any) -> dict[str, Any]:
    """Rank 0's measured numbers in its fastest step after the first: the step least disturbed by other
    processes on the shared cores (a rank descheduled mid-step makes its peers wait in their collectives)."""
    from hyper_parallel.viz.overlap import compute_by_phase, step_exposure

    step_times = result.metrics["step_times"]
    later = range(1, len(step_times)) if len(step_times) > 1 else range(len(step_times))
    step = min(later, key=lambda s: step_times[s])
    events = result.traces[0]
    exposure = step_exposure(events, step)
    compute = compute_by_phase(events, step)
    return {
        "index": step,
        "step": step_times[step],
        "exposed": exposure["exposed"],
        "compute": {phase: compute.get(phase, 0.0) for phase in ("forward", "backward")},
        "other": step_times[step] - exposure["compute"] - exposure["exposed"],
    }


def link_overlap_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per run that waited on an emulated link (the others are skipped): label, link, overlap,
    measured and modelled step time and exposed communication (seconds), and model / measured."""
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
                "exposed": measured["exposed"],
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
            "exposed ms, measured / model",
            "step ms, measured / model",
            "model / measured step",
        ],
        rows,
        caption=f"rank 0, its fastest step after the first; {link.describe() if link else 'no emulated link'}",
    )
