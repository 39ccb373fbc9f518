"""Pipeline parallelism in the cost model: the bubble, the P2P bytes and the activations alive per schedule.

Torch-free. With ``p`` stages in a row, ``m`` microbatches and forward + backward of one microbatch on
one stage taking one slot, a step of GPipe or 1F1B takes ``m + p - 1`` slots per rank, of which ``p - 1``
are idle: bubble = (p-1)/(m+p-1). Interleaving ``v`` stages per rank makes each slot v times shorter and
leaves the fill/drain at p-1 of them: bubble = (p-1)/(v*m+p-1). 1F1B keeps the bubble of GPipe but not
its memory: stage ``s`` holds at most ``p - s`` microbatches' activations, GPipe all ``m``.

The zero-bubble schedules split a backward into the input gradient B and the weight gradient W (Qi et al.
2023) and run 2 stages per rank in a V (rank r: stages r and 2p - 1 - r). With B = 2F and W = B / 2, the
idle time left is (p-1)/6 of a slot for ZB-V (``zbv``) and (p-1)/3 for DualPipeV (``dualpipev``; DeepSeek-V3
report, Table 2: (PP/2 - 1)(F&B + B - 3W) over PP = 2p half-rank stages): bubble = b / (m + b) with b
those slots.

Between stages only one tensor crosses per microbatch: the hidden states [rows, seq, d_model] forward,
their gradient (same shape) backward. TP without SP replicates it, so each tp rank sends its own copy
to its peer (same tp coordinate) of the next stage; two neighbouring stages on one rank (the turn of a V)
pass it in memory.
"""

from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev")
BUBBLE_SLOTS = {"gpipe": 1.0, "1f1b": 1.0, "interleaved_1f1b": 1.0, "zbv": 1 / 6, "dualpipev": 1 / 3}
"""Idle slots per pipeline hop (p - 1 hops), before interleaving divides them by v (module docstring)."""
V_SCHEDULES = ("zbv", "dualpipev")  # 2 stages per rank in a V


def _check(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; one of {SCHEDULES}")
    if pp < 1 or microbatches < 1 or stages_per_rank < 1:
        raise ValueError(
            f"pp, microbatches and stages_per_rank must be >= 1, got {pp}, {microbatches}, {stages_per_rank}"
        )
    wanted = 2 if schedule in V_SCHEDULES else None
    if (stages_per_rank > 1) != (schedule in ("interleaved_1f1b", *V_SCHEDULES)) or wanted not in (
        None,
        stages_per_rank,
    ):
        raise ValueError(
            f"schedule {schedule!r} with stages_per_rank={stages_per_rank}: only interleaved_1f1b "
            f"runs several stages per rank (>= 2), and {' and '.join(V_SCHEDULES)} exactly 2"
        )


def bubble_fraction(schedule: str, pp: int, microbatches: int, stages_per_rank: int = 1) -> float:
    """Idle fraction of a step on every rank, equal-cost stages (module docstring)."""
    _check(schedule, pp, microbatches, stages_per_rank)
    slots = (pp - 1) * BUBBLE_SLOTS[schedule] / (stages_per_rank if schedule == "interleaved_1f1b" else 1)
    return slots / (microbatches + slots)


def alive_microbatches(schedule: str, pp: int, microbatches: int, stage: int) -> int:
    """Most microbatches whose activations stage ``stage`` holds at once (forwarded, not yet backwarded).

    GPipe runs every forward before the first backward: m. 1F1B warms up with p - s forwards, then each
    forward follows a backward: min(m, p - s).
    """
    _check(schedule, pp, microbatches, 1)
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is outside 0..{pp - 1}")
    return microbatches if schedule == "gpipe" else min(microbatches, pp - stage)


def boundary_bytes(rows: int, seq_len: int, d_model: int, element_size: int = 4) -> int:
    """Bytes of the tensor one microbatch sends across a stage boundary (hidden states or their gradient)."""
    return rows * seq_len * d_model * element_size


def p2p_bytes(
    pp: int, pp_rank: int, microbatches: int, message_bytes: int, stages_per_rank: int = 1, schedule: str = "1f1b"
) -> dict[tuple[str, str], int]:
    """Bytes one rank sends and receives in one step, by (op, phase), op in {"send", "recv"}.

    Rank ``pp_rank`` holds stages pp_rank, pp_rank + pp, ... (loop placement), or pp_rank and 2 pp - 1 -
    pp_rank (the V of ``V_SCHEDULES``). Per microbatch, a stage that is not the last sends its output
    forward and receives its gradient backward; one that is not the first receives its input forward and
    sends the input's gradient backward; a neighbour on the same rank costs nothing.
    """
    if not 0 <= pp_rank < pp:
        raise ValueError(f"pp_rank {pp_rank} is outside 0..{pp - 1}")
    last = pp * stages_per_rank - 1

    def rank_of(stage: int) -> int:
        return (stage if stage < pp else last - stage) if schedule in V_SCHEDULES else stage % pp

    totals = {("send", "forward"): 0, ("recv", "forward"): 0, ("send", "backward"): 0, ("recv", "backward"): 0}
    for stage in (s for s in range(last + 1) if rank_of(s) == pp_rank):
        if stage != last and rank_of(stage + 1) != pp_rank:
            totals[("send", "forward")] += microbatches * message_bytes
            totals[("recv", "backward")] += microbatches * message_bytes
        if stage != 0 and rank_of(stage - 1) != pp_rank:
            totals[("recv", "forward")] += microbatches * message_bytes
            totals[("send", "backward")] += microbatches * message_bytes
    return totals


def plan_lines(config, dims) -> list[str]:
    """What ``python -m launch plan`` prints for pp > 1 (``config`` a ModelConfig, ``dims`` ParallelDims).

    The microbatches are the layout's accumulation steps (``ModelConfig.accumulation``); the tensor crossing
    a boundary is one microbatch's hidden states in the compute precision, sequence-sharded by cp (and by
    tp with sequence parallelism).
    """
    rows, microbatches = config.accumulation(dims)
    seq = config.seq_len // dims.cp // (dims.tp if config.uses_sequence_parallel(dims) else 1)
    message = boundary_bytes(rows, seq, config.d_model, config.precision.compute)
    middle = p2p_bytes(dims.pp, min(1, dims.pp - 1), microbatches, message)
    lines = [
        f"pipeline: pp={dims.pp} stages of {config.n_layers / dims.pp:g} layers, {microbatches} microbatch(es) "
        f"of {rows} rows (the accumulation steps; set --micro-batch to have more)"
    ]
    if microbatches < dims.pp:
        lines.append(
            f"  WARNING: {microbatches} microbatch(es) < pp={dims.pp}: the pipeline never fills (1F1B refuses it)"
        )
    for schedule in ("gpipe", "1f1b"):
        bubble = bubble_fraction(schedule, dims.pp, microbatches)
        alive = alive_microbatches(schedule, dims.pp, microbatches, 0)
        lines.append(
            f"  {schedule:<6} bubble (p-1)/(m+p-1) = {bubble:.0%}; stage 0 holds {alive} microbatch(es) of activations"
        )
    lines.append(
        f"  P2P per step on stage 1: {sum(middle.values()) / 2**20:.1f} MiB sent + received "
        f"({message / 2**20:.2f} MiB per microbatch each way)"
    )
    lines.append(
        f"  the memory above is the worst stage's (its layers, embedding or head, and the microbatches in flight "
        f"of {config.pp_schedule}); the step adds the bubble of {config.pp_schedule}"
    )
    return lines
