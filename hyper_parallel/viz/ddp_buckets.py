"""Torch DDP's buckets on one rank's trace (``hyper_parallel.benchmark.ddp_buckets``, notebook 01): per step,
when each gradient arrived and when each bucket's all-reduce was issued and done, from the start of backward."""

from __future__ import annotations

from matplotlib.figure import Figure

from hyper_parallel.viz.style import group_color, new_figure


def bucket_steps(events: list[dict]) -> list[dict]:
    """Per step: its buckets in issue order (module, parameters, bytes, issued and done in ms from the start
    of backward), when the last gradient arrived, and how many buckets were issued before it (overlapped)."""
    steps = sorted({e["step"] for e in events if e.get("kind") == "backward"})
    found = []
    for step in steps:
        start = next(e["t_start"] for e in events if e.get("kind") == "backward" and e["step"] == step)
        buckets = sorted(
            (e for e in events if e.get("kind") == "collective" and e["step"] == step), key=lambda e: e["t_start"]
        )
        arrivals = [e["t_start"] for e in events if e.get("kind") == "gradient" and e["step"] == step]
        last = max(arrivals)
        found.append(
            {
                "step": step,
                "buckets": [
                    {
                        "module": b["module"],
                        "parameters": b["parameters"],
                        "bytes": b["bytes"],
                        "issued_ms": (b["t_start"] - start) * 1e3,
                        "done_ms": (b["t_end"] - start) * 1e3,
                    }
                    for b in buckets
                ],
                "last_gradient_ms": (last - start) * 1e3,
                "overlapped": sum(b["t_start"] < last for b in buckets),
            }
        )
    return found


def ddp_buckets_figure(events: list[dict], steps: tuple[int, ...] = (0, 1)) -> Figure:
    """One panel per step: a tick per gradient arrival (top row) and a bar per bucket's all-reduce from its
    issue to its completion (bottom row), the last gradient marked by a dashed line."""
    found = {s["step"]: s for s in bucket_steps(events)}
    fig = new_figure(10, 1.0 + 1.3 * len(steps))
    axes = fig.subplots(len(steps), 1, sharex=True, squeeze=False)[:, 0]
    for ax, step in zip(axes, steps):
        summary = found[step]
        start = next(e["t_start"] for e in events if e.get("kind") == "backward" and e["step"] == step)
        arrivals = [(e["t_start"] - start) * 1e3 for e in events if e.get("kind") == "gradient" and e["step"] == step]
        ax.vlines(arrivals, 1.6, 2.4, color="black", linewidth=1)
        for index, bucket in enumerate(summary["buckets"]):
            width = bucket["done_ms"] - bucket["issued_ms"]
            ax.barh(0.6 + 0.25 * (index % 2), width, left=bucket["issued_ms"], height=0.4, color=group_color(index))
            ax.text(bucket["issued_ms"], 0.6 + 0.25 * (index % 2), f" {bucket['module']}", va="center", fontsize=7)
        ax.axvline(summary["last_gradient_ms"], color="grey", linestyle="--", linewidth=1)
        ax.set_yticks([0.7, 2.0], ["all-reduce", "gradient ready"], fontsize=8)
        ax.set_ylim(0, 2.8)
        ax.set_title(
            f"step {step}: {len(summary['buckets'])} bucket(s), {summary['overlapped']} issued before the last gradient",
            fontsize=9,
        )
    axes[-1].set_xlabel("ms from the start of backward (rank 0)")
    fig.suptitle("torch DDP: bucketed all-reduces against backward (dashed: the last gradient)", fontsize=10)
    return fig
