"""The alpha-beta model of a collective: a latency per step of the algorithm plus the bytes each rank sends
over its link's bandwidth, fitted to measured times and applied to the planner's machines.

    t(op, n, M) = alpha * hops(op, n) + wire(op, n) * M / beta

``M`` is the full buffer (the trace convention: all-gather output, reduce-scatter input, all-reduce
tensor, all-to-all input; a send's message), ``n`` the ranks, ``alpha`` seconds per step, ``beta`` bytes
per second one rank sends. Ring algorithms (what the planner assumes, ``communication.wire_factor``):

    op               hops        wire (bytes sent per byte of M)
    all_reduce       2 (n - 1)   2 (n - 1) / n   (a reduce-scatter, then an all-gather)
    all_gather       n - 1       (n - 1) / n
    reduce_scatter   n - 1       (n - 1) / n
    all_to_all       n - 1       (n - 1) / n     (one exchange with every other rank)
    send_recv        1           1               (every rank sends M to the next and receives M)

A tree all-reduce (reduce up a binary tree, broadcast down; pipelined in chunks, two trees each carrying
half, as NCCL's double binary tree) takes 2 ceil(log2 n) steps and sends about 2 M per rank: fewer steps
than the ring from n = 4 on, never fewer bytes. The two cost the same at ``ring_tree_crossover_bytes``.

``fit`` solves, per collective, the least squares of the relative error (each time weighted by its
inverse, so a 10 us time counts as much as a 10 ms one) for alpha and 1/beta, both held >= 0.

``LINKS``: the planner's machines as alpha-beta pairs. beta is the preset's per-rank bandwidth
(``hardware.HARDWARE``: NVLink inside an H100 node, InfiniBand / RoCE across nodes); the planner models no
latency, so alpha is an assumption stated here (order of magnitude of one step of NCCL's ring, not fitted):
1 us on NVLink, 5 us across nodes, 2 us on PCIe. PCIe has no planner preset: 4.0 x16 carries 32 GB/s per
direction, taken at 75 % (24 GB/s), also an assumption.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hyper_parallel.cost_model.hardware import HARDWARE

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
ALGORITHMS = ("ring", "tree")


@dataclass(frozen=True)
class Link:
    """One link as alpha (seconds per step) and beta (bytes per second per rank), and where they come from."""

    name: str
    alpha: float
    beta: float
    source: str

    def seconds(self, op: str, n: int, nbytes: float, algorithm: str = "ring") -> float:
        return predict_seconds(op, n, nbytes, self.alpha, self.beta, algorithm)


_H100 = HARDWARE["h100-sxm"]
LINKS: dict[str, Link] = {
    "nvlink": Link(
        "NVLink (8 x H100 in a node)", 1e-6, _H100.intra_node_gbs * 1e9, "h100-sxm intra_node_gbs; alpha assumed"
    ),
    "infiniband": Link(
        "InfiniBand (across H100 nodes)", 5e-6, _H100.inter_node_gbs * 1e9, "h100-sxm inter_node_gbs; alpha assumed"
    ),
    "pcie": Link("PCIe 4.0 x16", 2e-6, 24e9, "no planner preset: 32 GB/s x 0.75 and alpha assumed"),
}


def _check(op: str, n: int, algorithm: str = "ring") -> None:
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective {op!r}; the alpha-beta model knows {', '.join(COLLECTIVES)}")
    if algorithm not in ALGORITHMS or (algorithm == "tree" and op != "all_reduce"):
        raise ValueError(f"algorithm {algorithm!r} for {op}: ring for every collective, tree for all_reduce only")
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"a collective needs n >= 2 ranks, got {n!r} (one rank communicates nothing)")


def hops(op: str, n: int, algorithm: str = "ring") -> int:
    """Steps of the algorithm, each paying alpha once (module docstring's table)."""
    _check(op, n, algorithm)
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(n))
    return {"all_reduce": 2 * (n - 1), "send_recv": 1}.get(op, n - 1)


def wire(op: str, n: int, algorithm: str = "ring") -> float:
    """Bytes one rank sends per byte of the full buffer."""
    _check(op, n, algorithm)
    if algorithm == "tree":
        return 2.0
    return {"all_reduce": 2 * (n - 1) / n, "send_recv": 1.0}.get(op, (n - 1) / n)


def predict_seconds(op: str, n: int, nbytes: float, alpha: float, beta: float, algorithm: str = "ring") -> float:
    """alpha * hops + wire * bytes / beta."""
    if not (alpha >= 0 and beta > 0 and nbytes >= 0):
        raise ValueError(f"need alpha >= 0 s, beta > 0 B/s and bytes >= 0, got {alpha}, {beta}, {nbytes}")
    return alpha * hops(op, n, algorithm) + wire(op, n, algorithm) * nbytes / beta


def ring_tree_crossover_bytes(n: int, alpha: float, beta: float) -> float:
    """The all-reduce size at which ring and tree take the same time: below it the tree (fewer steps) is
    faster, above it the ring (fewer bytes). 2(n-1) a + 2(n-1)/n M/b = 2 L a + 2 M/b gives
    M = n (n - 1 - L) a b with L = ceil(log2 n); 0 when the tree has no fewer steps (n <= 3)."""
    levels = math.ceil(math.log2(n))
    return max(0.0, n * (n - 1 - levels) * alpha * beta)


def cheaper_algorithm(n: int, nbytes: float, link: Link) -> str:
    """'ring' or 'tree': the faster all-reduce of ``nbytes`` on ``n`` ranks of ``link`` (ring on a tie)."""
    ring = link.seconds("all_reduce", n, nbytes, "ring")
    return "tree" if link.seconds("all_reduce", n, nbytes, "tree") < ring else "ring"


@dataclass(frozen=True)
class Sample:
    """One measured time: ``op`` on ``n`` ranks moving a full buffer of ``nbytes``."""

    op: str
    n: int
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class Fit:
    """alpha (s per step) and beta (B/s per rank) of one collective, and how well they fit its samples."""

    op: str
    alpha: float
    beta: float
    samples: int
    rms_relative_error: float

    def seconds(self, n: int, nbytes: float) -> float:
        return predict_seconds(self.op, n, nbytes, self.alpha, self.beta)

    def describe(self) -> str:
        return (
            f"{self.op}: alpha {self.alpha * 1e6:.1f} us, beta {self.beta / 1e9:.2f} GB/s "
            f"({self.samples} samples, rms error {self.rms_relative_error:.0%})"
        )


def _solve(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(alpha, inverse beta) >= 0 minimising sum (x a + y c - t)^2 / t^2 over rows (x, y, t)."""
    sxx = sum(x * x / t**2 for x, _, t in rows)
    syy = sum(y * y / t**2 for _, y, t in rows)
    sxy = sum(x * y / t**2 for x, y, t in rows)
    sxt = sum(x / t for x, _, t in rows)
    syt = sum(y / t for _, y, t in rows)
    det = sxx * syy - sxy * sxy
    if det > 1e-12 * sxx * syy:
        alpha, inverse = (sxt * syy - syt * sxy) / det, (syt * sxx - sxt * sxy) / det
        if alpha >= 0 and inverse > 0:
            return alpha, inverse
    # one of them at its bound: the best fit of the other alone (latency only, or bandwidth only)
    only_bandwidth = (0.0, syt / syy)
    only_latency = (sxt / sxx, 0.0)

    def error(pair: tuple[float, float]) -> float:
        return sum(((x * pair[0] + y * pair[1]) - t) ** 2 / t**2 for x, y, t in rows)

    return min((only_bandwidth, only_latency), key=error)


def fit(samples: Iterable[Sample]) -> dict[str, Fit]:
    """alpha and beta per collective from its samples (at least two sizes); ``ValueError`` otherwise."""
    by_op: dict[str, list[Sample]] = {}
    for sample in samples:
        _check(sample.op, sample.n)
        if not (sample.seconds > 0 and sample.nbytes >= 0):
            raise ValueError(f"a sample needs seconds > 0 and bytes >= 0, got {sample}")
        by_op.setdefault(sample.op, []).append(sample)
    fits = {}
    for op, group in by_op.items():
        if len({s.nbytes for s in group}) < 2:
            raise ValueError(f"{op}: alpha and beta need samples of at least two sizes, got {len(group)} sample(s)")
        rows = [(hops(op, s.n), wire(op, s.n) * s.nbytes, s.seconds) for s in group]
        alpha, inverse = _solve(rows)
        beta = 1 / inverse if inverse > 0 else math.inf
        errors = [((x * alpha + y * inverse) - t) / t for x, y, t in rows]
        rms = math.sqrt(sum(e * e for e in errors) / len(errors))
        fits[op] = Fit(op, alpha, beta, len(group), rms)
    return {op: fits[op] for op in COLLECTIVES if op in fits}


def samples_from_rows(rows: Iterable[Mapping]) -> list[Sample]:
    """``Sample``s from measured rows with keys op, n, bytes, seconds (``benchmark.collectives``)."""
    return [Sample(row["op"], int(row["n"]), float(row["bytes"]), float(row["seconds"])) for row in rows]
