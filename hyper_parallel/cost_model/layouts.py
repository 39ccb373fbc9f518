"""Layouts on real machines: which groups cross node boundaries, a step's communication time, and a
ranking of every valid layout of one world size.

Placement: torchrun gives node n the ranks [n * G, (n + 1) * G) for G GPUs per node, so a group
crosses nodes when its ranks fall into more than one such block. TP is the innermost mesh dim
(contiguous ranks), so it stays inside a node whenever tp divides G.

Time model of one collective (stated wherever a time is shown): ring collectives, each rank sends
``bytes * wire_factor(op, n)`` (``communication.wire_factor``) at the bandwidth of the slowest link
its group uses: ``intra_node`` if every rank of the group is on one node, else ``inter_node``.
A ring all-gather or reduce-scatter also waits one latency per ring step, as NCCL models it (NVIDIA/nccl
src/graph/tuning.cc at 01afd20, ``ncclTopoTuneModel``): a call on n ranks over k nodes takes n - 1 steps,
k - 1 of them across nodes, and costs base + (n - k) x step inside a node + (k - 1) x step across nodes
+ its bandwidth time, with NCCL's protocol choice, the cheaper of Simple (8.4 us base, 3.4 us NVLink
step, 9.6 us network step) and LL (6.6, 0.47 (x 1.8 across nodes), 2.7 us, a quarter of the bandwidth
across nodes, a third inside one). All-reduces (NCCL also has trees), all-to-alls and P2P are timed by
bandwidth alone.
``comm_seconds`` sums them as if nothing overlapped; ``step_time`` adds compute and overlap, and
``cost_model.ranking.rank_layouts`` ranks by that step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import log2, prod

from hyper_parallel.cost_model import CostEstimate
from hyper_parallel.cost_model.communication import wire_factor
from hyper_parallel.mesh import ParallelDims, valid_choices

GIB = 1024**3


def fmt_bytes(n: float) -> str:
    """Bytes as the plan, the figures and the lessons print them (B, KiB, MiB, GiB); here, beside ``GIB``, so a
    text plan needs no plotting library."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@dataclass(frozen=True)
class Bandwidth:
    """Bytes per second one rank can send."""

    intra_node: float = 150e9  # NVLink-class
    inter_node: float = 25e9  # one 200 Gb/s NIC per GPU

    def describe(self) -> str:
        return (
            f"ring collectives, bytes on the wire = full buffer x (n-1)/n (all-reduce x 2(n-1)/n), "
            f"{self.intra_node / 1e9:g} GB/s per rank inside a node, {self.inter_node / 1e9:g} GB/s per rank "
            f"for groups that span nodes, all-gathers and reduce-scatters plus NCCL's ring latency per step, no overlap"
        )


@lru_cache(maxsize=65536)
def _group_structure(dims: ParallelDims, group: str) -> tuple[int, int, int]:
    """(stride, size, block) of a trace group name: one mesh dim ("tp") or adjacent dims of one view
    joined by '+' ("dp_replicate+fsdp", fully_shard's unsharded group when it does not shard). The groups
    are {base + offset + k * stride : k < size} for base in multiples of block, offset < stride
    (ParallelDims.group_ranks' arithmetic, TP innermost)."""
    names = group.split("+")
    for view in dims.views().values():
        order = [name for name, _ in view]
        if all(name in order for name in names):
            first, last = order.index(names[0]), order.index(names[-1])
            if order[first : last + 1] == names:
                sizes = [size for _, size in view]
                stride, size = prod(sizes[last + 1 :]), prod(sizes[first : last + 1])
                return stride, size, stride * size
    raise ValueError(
        f"group {group!r} is not a mesh dim, or a run of adjacent dims of one view, of "
        f"{dims.describe().splitlines()[0]}"
    )


def group_ranks(dims: ParallelDims, group: str) -> list[list[int]]:
    """Every group of a trace group name (``_group_structure``), each as its global ranks."""
    stride, size, block = _group_structure(dims, group)
    return [
        [base + offset + k * stride for k in range(size)]
        for base in range(0, dims.world_size, block)
        for offset in range(stride)
    ]


def nodes_spanned(dims: ParallelDims, group: str, gpus_per_node: int) -> int:
    """The most nodes any one group of ``group`` spans (1: all its groups stay inside a node).

    A group's ranks c, c + stride, ...: with stride >= G every rank is on its own node; otherwise no node
    between the first and the last rank is skipped. Shifting c by G shifts every node by one, so only the
    residues c mod G of the groups' first ranks need checking."""
    check_gpus_per_node(dims.world_size, gpus_per_node)
    return _nodes_spanned(*_group_structure(dims, group), dims.world_size, gpus_per_node)


@lru_cache(maxsize=4096)
def _nodes_spanned(stride: int, size: int, block: int, world_size: int, gpus_per_node: int) -> int:
    """``nodes_spanned`` from a group's structure: the first ranks are base + offset (base a multiple of
    block, offset < stride); their residues mod G repeat after G bases and G offsets, so at most G x G of
    them are looked at whatever the world size (a --compare costs thousands of layouts)."""
    if stride >= gpus_per_node:
        return size
    bases = range(0, min(world_size, block * gpus_per_node), block)
    firsts = {(base + offset) % gpus_per_node for base in bases for offset in range(min(stride, gpus_per_node))}
    return max((c + (size - 1) * stride) // gpus_per_node - c // gpus_per_node + 1 for c in firsts)


def check_gpus_per_node(world_size: int, gpus_per_node: int) -> None:
    if gpus_per_node < 1 or world_size % gpus_per_node and world_size > gpus_per_node:
        nearest = min(
            (d for d in range(1, world_size + 1) if world_size % d == 0), key=lambda d: (abs(d - gpus_per_node), -d)
        )
        raise ValueError(
            f"gpus_per_node={gpus_per_node} must be >= 1 and divide world_size={world_size} "
            f"(every node runs the same number of ranks); nearest valid --gpus-per-node: {nearest}"
        )


@dataclass(frozen=True)
class TimedCollective:
    op: str
    group: str
    phase: str
    bytes: float
    count: int
    group_size: int
    wire_bytes: float
    crosses_nodes: bool
    seconds: float


def timed_collectives(
    cost: CostEstimate, gpus_per_node: int, bandwidth: Bandwidth = Bandwidth()
) -> list[TimedCollective]:
    return time_collectives(cost.dims, cost.collectives, gpus_per_node, bandwidth)


def time_collectives(
    dims: ParallelDims, collectives, gpus_per_node: int, bandwidth: Bandwidth
) -> list[TimedCollective]:
    """``timed_collectives`` of a list of collectives on ``dims`` (a pipeline stage's)."""
    spans: dict[str, int] = {}
    result = []
    for c in collectives:
        if c.group not in spans:
            spans[c.group] = nodes_spanned(dims, c.group, gpus_per_node)
        crosses = spans[c.group] > 1
        wire = c.bytes * wire_factor(c.op, c.group_size)
        speed = bandwidth.inter_node if crosses else bandwidth.intra_node
        seconds = ring_seconds(c.op, c.group_size, spans[c.group], c.count, wire / speed)
        result.append(TimedCollective(c.op, c.group, c.phase, c.bytes, c.count, c.group_size, wire, crosses, seconds))
    return result


NCCL_RING_LATENCY = {  # protocol: (base, step inside a node, step across nodes) in seconds, bandwidth divisor
    "simple": (8.4e-6, 3.4e-6, 9.6e-6),
    "ll": (6.6e-6, 0.47e-6, 2.7e-6),
}


def ring_seconds(op: str, group_size: int, nodes: int, calls: int, bandwidth_seconds: float) -> float:
    """``calls`` ring all-gathers or reduce-scatters of ``bandwidth_seconds`` in all (module docstring: NCCL's
    latency per ring step and its choice of protocol); other collectives: their bandwidth time."""
    if op not in ("all_gather", "reduce_scatter") or group_size <= 1 or calls < 1:
        return bandwidth_seconds
    per_call = bandwidth_seconds / calls
    inter_steps = nodes - 1
    intra_steps = group_size - 1 - inter_steps
    base, intra, inter = NCCL_RING_LATENCY["simple"]
    simple = base + intra_steps * intra + inter_steps * inter + per_call
    base, intra, inter = NCCL_RING_LATENCY["ll"]
    intra *= 1.8 if nodes > 1 else 1.0
    ll = base + intra_steps * intra + inter_steps * inter + per_call * (4 if nodes > 1 else 3)
    return calls * min(simple, ll)


def candidate_layouts(world_size: int, with_experts: bool, pipeline: bool = False) -> list[ParallelDims]:
    """``valid_choices(world_size)`` (pp = 1 unless ``pipeline``); ep and etp stay 1 unless the model has
    experts (then the (pp, dp_replicate, cp, tp) products are enumerated directly: no expert degrees to try)."""
    if with_experts:
        return valid_choices(world_size, pipeline=pipeline)
    return list(_dense_layouts(world_size, pipeline))


@lru_cache(maxsize=64)
def _dense_layouts(world_size: int, pipeline: bool) -> tuple[ParallelDims, ...]:
    divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
    result = []
    for pp in divisors if pipeline else (1,):
        stage = world_size // pp
        for dp_replicate in (d for d in divisors if stage % d == 0):
            for cp in (d for d in divisors if (stage // dp_replicate) % d == 0):
                for tp in (d for d in divisors if (stage // (dp_replicate * cp)) % d == 0):
                    shard = stage // (dp_replicate * cp * tp)
                    try:
                        result.append(
                            ParallelDims(world_size, dp_replicate=dp_replicate, dp_shard=shard, cp=cp, tp=tp, pp=pp)
                        )
                    except ValueError:
                        continue
    return tuple(result)


def nearest_valid(layouts: list[ParallelDims], wanted: dict[str, int]) -> ParallelDims | None:
    """The layout a widget suggests for an invalid choice, as the mesh widget chooses it: the fewest changed
    degrees; then the fewest parallelisms switched off (a degree > 1 set to 1); then the smallest change
    in factors of two; then enumeration order."""

    def distance(dims: ParallelDims) -> tuple[int, int, float]:
        changed = sum(getattr(dims, k) != v for k, v in wanted.items())
        switched_off = sum(getattr(dims, k) == 1 < v for k, v in wanted.items())
        return changed, switched_off, sum(abs(log2(getattr(dims, k) / v)) for k, v in wanted.items() if v > 0)

    return min(layouts, key=distance, default=None)
