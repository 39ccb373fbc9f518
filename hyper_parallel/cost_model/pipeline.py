"""Pipeline parallelism in the cost model: schedules, which layers each stage holds, the bubble, the P2P
bytes and the activations alive per schedule.

Torch-free. The schedules are torch.distributed.pipelining's (names with '_' here, '-' on the command
line). With ``p`` pp ranks, ``m`` microbatches, ``v`` stages per rank and ``t`` one rank's forward +
backward of one microbatch (its layers), a step takes ``m t + bubble``:

    schedule          torch class                     stages/rank  placement  bubble              in flight (rank r)
    gpipe             ScheduleGPipe                   1            -          (p-1) t             m
    1f1b              Schedule1F1B                    1            -          (p-1) t             min(m, p - r)
    interleaved_1f1b  ScheduleInterleaved1F1B         >= 2         loop       (p-1) t / v         warm-up chunks / v
    interleaved_zb    ScheduleInterleavedZeroBubble   >= 2         loop       (p-1) t / (3 v)     warm-up chunks / v
    zbv               ScheduleZBVZeroBubble           2            v          (p-1) t / 6         min(m, p)
    dualpipev         ScheduleDualPipeV               2            v          (p-1) t / 3         min(m, p + 1/2)

"In flight": the microbatches whose activations a rank holds at its peak, in units of one microbatch
through all of the rank's layers. The interleaved warm-up is torch's ``_get_warmup_ops``: (v - 1) N +
2 (p - 1 - r) chunks (N = m // max(1, m // p) microbatches per round; Megatron-LM's N = p) plus the one
in flight, at most m v, each chunk 1 / v of the rank's layers. Zero-bubble schedules split the backward
into the input gradient B and the weight gradient W (Qi et al. 2023): with B = 2F and W = B / 2 (the two
matmuls of a backward), ZB-H1's bubble (p-1)(F + B - 2W) is a third of 1F1B's, and ZB-V's chunks are
half a rank. DualPipe's table (DeepSeek-V3 report, Table 2; deepseek-ai/DualPipe README): bubble
(PP/2 - 1)(F&B + B - 3W) over PP stages, F&B the overlapped forward and backward of two chunks, so
with 2p stages of half a rank (DualPipeV on p ranks) (p-1) t / 3; activations PP + 1 stages. DualPipe(V)
overlaps the EP all-to-all and the P2P sends with the paired chunk's compute (``hides``).

Placement: stage s of S = p v runs on rank s mod p ("loop") or, for the V schedules, on rank s for
s < p and 2p - 1 - s after (``generate_stage_to_rank_mapping(style="v")``): rank 0 holds the first and
the last stage. The layers split into S stages in order (``stage_layer_counts``): as given
(``ModelConfig.stage_layers``: Megatron's ``--decoder-first/last-pipeline-num-layers``, BLOOM's
embedding-weighted split, Llama 3's first and last stage one layer short), evenly when S divides them,
otherwise torchtitan's ``generate_split_points`` (the first and last stage one layer short of the
middle ones).

Between stages only one tensor crosses per microbatch: the hidden states [rows, seq, d_model] forward,
their gradient (same shape) backward. TP without SP replicates it, so each tp rank sends its own copy
to its peer (same tp coordinate) of the next stage; two stages on one rank pass it in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Schedule:
    name: str
    torch_class: str
    stages_per_rank: str  # "one", "several" (>= 2), "two"
    placement: str  # "loop" or "v"
    bubble_per_hop: float  # bubble = (p - 1) x t x this (v folded in by ``bubble_factor``)
    hides: tuple[str, ...] = ()  # critical groups the schedule overlaps with compute

    @property
    def default_stages_per_rank(self) -> int:
        """Stages per rank when none is given: one, or two for the schedules that run several (interleaved) or
        exactly two (the V schedules)."""
        return 1 if self.stages_per_rank == "one" else 2

    def check_stages(self, stages_per_rank: int) -> None:
        wanted = {"one": stages_per_rank == 1, "several": stages_per_rank >= 2, "two": stages_per_rank == 2}
        if not wanted[self.stages_per_rank]:
            nearest = {"one": 1, "several": 2, "two": 2}[self.stages_per_rank]
            raise ValueError(
                f"schedule {self.name!r} with stages_per_rank={stages_per_rank}: only interleaved_1f1b runs "
                f"several stages per rank (interleaved_zb too; zbv and dualpipev run exactly two, the others one); "
                f"nearest valid virtual_stages: {nearest}"
            )

    def bubble_factor(self, stages_per_rank: int) -> float:
        """The bubble in units of (p - 1) t."""
        return self.bubble_per_hop / (stages_per_rank if self.stages_per_rank == "several" else 1)

    def microbatch_rule(self, pp: int, microbatches: int, stages_per_rank: int) -> str | None:
        """None when the schedule runs ``microbatches``, else the rule it breaks (torch's checks)."""
        if self.name == "1f1b" and microbatches < pp:
            return f"1f1b needs at least pp = {pp} microbatches per step"
        if self.stages_per_rank == "several" and microbatches % max(1, microbatches // pp):
            return (
                f"{self.name} needs the microbatches to be a multiple of its rounds, max(1, m // pp) "
                f"(torch's flexible interleaving)"
            )
        if self.name == "dualpipev" and microbatches < pp * stages_per_rank:
            return f"dualpipev needs at least as many microbatches as stages, {pp * stages_per_rank}"
        return None


SCHEDULE_LIST = (
    Schedule("gpipe", "ScheduleGPipe", "one", "loop", 1.0),
    Schedule("1f1b", "Schedule1F1B", "one", "loop", 1.0),
    Schedule("interleaved_1f1b", "ScheduleInterleaved1F1B", "several", "loop", 1.0),
    Schedule("interleaved_zb", "ScheduleInterleavedZeroBubble", "several", "loop", 1 / 3),
    Schedule("zbv", "ScheduleZBVZeroBubble", "two", "v", 1 / 6),
    Schedule("dualpipev", "ScheduleDualPipeV", "two", "v", 1 / 3, hides=("ep", "pp")),
)
SCHEDULES = tuple(s.name for s in SCHEDULE_LIST)
_BY_NAME = {s.name: s for s in SCHEDULE_LIST}


def get_schedule(name: str) -> Schedule:
    if name not in _BY_NAME:
        raise ValueError(f"unknown schedule {name!r}; one of {SCHEDULES}")
    return _BY_NAME[name]


def _check(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> Schedule:
    record = get_schedule(schedule)
    if pp < 1 or microbatches < 1 or stages_per_rank < 1:
        raise ValueError(
            f"pp, microbatches and stages_per_rank must be >= 1, got {pp}, {microbatches}, {stages_per_rank}"
        )
    record.check_stages(stages_per_rank)
    return record


def rounds(pp: int, microbatches: int) -> int:
    """torch's rounds of a step: max(1, m // pp) groups of microbatches that pass every stage in turn."""
    return max(1, microbatches // pp)


def bubble_fraction(schedule: str, pp: int, microbatches: int, stages_per_rank: int = 1) -> float:
    """Idle fraction of a step on every rank, equal-cost stages: b / (m + b) with b = (p - 1) x the
    schedule's bubble factor (module docstring)."""
    bubble = (pp - 1) * _check(schedule, pp, microbatches, stages_per_rank).bubble_factor(stages_per_rank)
    return bubble / (microbatches + bubble)


def alive_microbatches(schedule: str, pp: int, microbatches: int, stage: int, stages_per_rank: int = 1) -> float:
    """Microbatches of activations pp rank ``stage`` holds at its peak, in units of all its layers
    (module docstring's "in flight"); an integer for the one-stage schedules."""
    record = _check(schedule, pp, microbatches, stages_per_rank)
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is outside 0..{pp - 1}")
    m, v = microbatches, stages_per_rank
    if record.name == "gpipe":
        return m
    if record.name == "1f1b":
        return min(m, pp - stage)
    if record.stages_per_rank == "several":
        per_round = m // max(1, m // pp)
        return min(m * v, (v - 1) * per_round + 2 * (pp - 1 - stage) + 1) / v
    if record.name == "zbv":
        return float(min(m, pp))
    return min(float(m), pp + 0.5)


def stage_rank(schedule: str, pp: int, stage: int, stages_per_rank: int) -> int:
    """The pp rank that runs ``stage`` (module docstring, "Placement")."""
    if get_schedule(schedule).placement == "v":
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


@lru_cache(maxsize=1024)
def _placement(schedule: str, pp: int, stages_per_rank: int) -> tuple[int, ...]:
    """The rank of every stage, in stage order."""
    return tuple(stage_rank(schedule, pp, stage, stages_per_rank) for stage in range(pp * stages_per_rank))


def rank_stage_indices(schedule: str, pp: int, stages_per_rank: int) -> list[tuple[int, ...]]:
    """The stages of every pp rank, in stage order."""
    result: list[list[int]] = [[] for _ in range(pp)]
    for stage, rank in enumerate(_placement(schedule, pp, stages_per_rank)):
        result[rank].append(stage)
    return [tuple(stages) for stages in result]


def stage_layer_counts(n_layers: int, stages: int, given: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Layers of every stage in order (module docstring, "Placement"); ``ValueError`` when ``given`` does
    not fit or there are more stages than layers."""
    if given is not None:
        if len(given) != stages or sum(given) != n_layers or min(given, default=0) < 0:
            raise ValueError(
                f"stage_layers {list(given)} must give {stages} stages (pp x virtual_stages) of >= 0 layers "
                f"summing to n_layers={n_layers}; got {len(given)} stages summing to {sum(given)}"
            )
        return tuple(given)
    if stages > n_layers:
        raise ValueError(
            f"{stages} pipeline stages (pp x virtual_stages) for n_layers={n_layers}: each stage needs a layer "
            "(or give stage_layers with empty first/last stages)"
        )
    base, extra = divmod(n_layers, stages)
    if not extra:
        return (base,) * stages
    counts = [base]  # torchtitan's generate_split_points: the middle stages take the extra layers
    for _ in range(stages - 2):
        counts.append(base + (1 if extra else 0))
        extra -= 1 if extra else 0
    return (*counts, n_layers - sum(counts)) if stages > 1 else (n_layers,)


def edge_stages(pp: int, stages_per_rank: int, first: int, last: int, n_layers: int) -> tuple[int, ...]:
    """Megatron's ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``: the
    first and last stage hold ``first`` and ``last`` layers, the others split the rest evenly."""
    stages = pp * stages_per_rank
    middle_stages, rest = stages - 2, n_layers - first - last
    if stages < 2 or rest < 0 or (middle_stages and rest % middle_stages) or (not middle_stages and rest):
        raise ValueError(
            f"first={first} and last={last} layers leave {rest} for {max(middle_stages, 0)} middle stages of "
            f"n_layers={n_layers} on {stages} stages: they must split evenly"
        )
    return (first, *([rest // middle_stages] * middle_stages if middle_stages else []), last)


def boundary_bytes(rows: int, seq_len: int, d_model: int, element_size: int = 4) -> int:
    """Bytes of the tensor one microbatch sends across a stage boundary (hidden states or their gradient)."""
    return rows * seq_len * d_model * element_size


def p2p_bytes(
    pp: int, pp_rank: int, microbatches: int, message_bytes: int, stages_per_rank: int = 1, schedule: str = "1f1b"
) -> dict[tuple[str, str], int]:
    """Bytes one rank sends and receives in one step, by (op, phase), op in {"send", "recv"}.

    Per microbatch, a stage that is not the last sends its output forward and receives its gradient
    backward; one that is not the first receives its input forward and sends the input's gradient
    backward; a neighbour on the same rank (the V schedules' turn) costs nothing.
    """
    if not 0 <= pp_rank < pp:
        raise ValueError(f"pp_rank {pp_rank} is outside 0..{pp - 1}")
    last = pp * stages_per_rank - 1
    totals = {("send", "forward"): 0, ("recv", "forward"): 0, ("send", "backward"): 0, ("recv", "backward"): 0}
    placement = _placement(schedule, pp, stages_per_rank)
    for stage in (s for s, rank in enumerate(placement) if rank == pp_rank):
        if stage != last and placement[stage + 1] != pp_rank:
            totals[("send", "forward")] += microbatches * message_bytes
            totals[("recv", "backward")] += microbatches * message_bytes
        if stage != 0 and placement[stage - 1] != pp_rank:
            totals[("recv", "forward")] += microbatches * message_bytes
            totals[("send", "backward")] += microbatches * message_bytes
    return totals


def layer_ranges(layers: tuple[int, ...]) -> str:
    """'0-3, 64-67' for a rank's layers (runs of consecutive layers), '-' for none."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs) or "-"


def plan_lines(config, dims) -> list[str]:
    """What ``python -m launch plan`` prints for pp > 1 (``config`` a ModelConfig, ``dims`` ParallelDims).

    The microbatches are the layout's accumulation steps (``ModelConfig.accumulation``); the tensor crossing
    a boundary is one microbatch's hidden states in the compute precision, sequence-sharded by cp (and by
    tp with sequence parallelism).
    """
    rows, microbatches = config.accumulation(dims)
    seq = config.seq_len // dims.cp // (dims.tp if config.uses_sequence_parallel(dims) else 1)
    message = boundary_bytes(rows, seq, config.d_model, config.precision.compute)
    v, schedule = config.virtual_stages, config.pp_schedule
    middle = p2p_bytes(dims.pp, min(1, dims.pp - 1), microbatches, message, v, schedule)
    counts = stage_layer_counts(config.n_layers, dims.pp * v, config.stage_layers)
    stages = f"pp={dims.pp}" + (f" x {v}" if v > 1 else "")
    runs: list[list[int]] = []  # "0, 1 x 126, 0": runs of equal counts
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    layers = ", ".join(f"{count}" if n == 1 else f"{count} x {n}" for count, n in runs)
    layers = f"{counts[0]}" if len(runs) == 1 else layers
    lines = [
        f"pipeline: {stages} stages of {layers} layers, {microbatches} microbatch(es) of {rows} rows (the "
        f"accumulation steps; set --micro-batch to have more); {get_schedule(schedule).torch_class}"
    ]
    if microbatches < dims.pp:
        broken = get_schedule(schedule).microbatch_rule(dims.pp, microbatches, v)
        lines.append(
            f"  WARNING: {microbatches} microbatch(es) < pp={dims.pp}: the pipeline never fills"
            + (f" ({broken})" if broken else "")
        )
    shown = ("gpipe", "1f1b") + ((schedule,) if schedule not in ("gpipe", "1f1b") else ())
    for name in shown:
        stages_per_rank = v if name == schedule else 1
        bubble = bubble_fraction(name, dims.pp, microbatches, stages_per_rank)
        alive = alive_microbatches(name, dims.pp, microbatches, 0, stages_per_rank)
        factor = get_schedule(name).bubble_factor(stages_per_rank)
        formula = "(p-1)/(m+p-1)" if factor == 1 else f"b/(m+b), b = (p-1) x {factor:.3g}"
        lines.append(
            f"  {name:<6} bubble {formula} = {bubble:.0%}; stage 0 holds {alive:g} microbatch(es) of activations"
            + ("  <- this plan" if name == schedule else "")
        )
    lines.append(
        f"  P2P per step on pp rank 1: {sum(middle.values()) / 2**20:.1f} MiB sent + received "
        f"({message / 2**20:.2f} MiB per microbatch each way)"
    )
    lines.append(
        "  the memory above is the worst stage's (its layers, embedding or head, and the microbatches in flight); "
        "the step adds the bubble of the slowest stage"
    )
    return lines
