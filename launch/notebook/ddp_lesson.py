"""Notebook 01's DDP-bucketing lesson: read ``hyper_parallel.benchmark.ddp_buckets``'s trace per step and say
how many buckets DDP all-reduced and how many of them it issued while backward was still computing."""

from __future__ import annotations

from hyper_parallel.viz.ddp_buckets import bucket_steps


def bucket_text(probe: dict) -> str:
    """What the learner reads under the run: per step the buckets, their parameters and bytes, and the overlap."""
    lines = [f"bucket_cap_mb = {probe['bucket_cap_bytes'] / 2**20:g} ({probe['bucket_cap_bytes']} B), rank 0"]
    for step in bucket_steps(probe["events"]):
        buckets = step["buckets"]
        lines.append(
            f"step {step['step']}: {len(buckets)} all-reduce(s); {step['overlapped']} issued before the last "
            f"gradient was ready ({step['last_gradient_ms']:.2f} ms into backward)"
        )
        for bucket in buckets:
            names = ", ".join(bucket["parameters"])
            lines.append(
                f"  {bucket['module']}: {bucket['bytes']} B, issued at {bucket['issued_ms']:.2f} ms, "
                f"done at {bucket['done_ms']:.2f} ms: {names}"
            )
    return "\n".join(lines)
