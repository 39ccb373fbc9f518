"""Notebook 07's torch.compile lesson: ``hyper_parallel.benchmark.compile_probe``'s two runs compared, in words."""

from __future__ import annotations


def compile_text(found: dict) -> str:
    """Whether compiling each block changed the collectives (op, group, unit, phase, bytes, step) or the losses,
    and what dynamo captured."""
    eager, compiled = found["eager"], found["compiled"]
    steps = len(eager["losses"])
    per_step = len(eager["collectives"]) // steps
    lines = [
        f"backend {found['backend']!r}, {steps} steps on rank 0",
        f"collectives per step: eager {per_step}, compiled {len(compiled['collectives']) // steps}; "
        f"the same sequence (op, group, unit, phase, bytes): {eager['collectives'] == compiled['collectives']}",
        f"losses eager    {eager['losses']}",
        f"losses compiled {compiled['losses']}  (bit-equal: {eager['losses'] == compiled['losses']})",
        f"dynamo: {compiled['graphs']} graph(s) captured for the blocks, {compiled['graph_breaks']} graph break(s)",
    ]
    lines += [
        f"  {op} on {group}, {unit}, {phase}: {nbytes} B"
        for op, group, unit, phase, nbytes, step in compiled["collectives"]
        if step == 0
    ]
    return "\n".join(lines)
