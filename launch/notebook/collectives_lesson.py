"""Notebook 00b's collectives, measured on the warm pool and fitted with the alpha-beta model.

    measured = measure_collectives(world_sizes=(4, 2), sizes=(1024, ..., 1 << 20))
    measured.fits["all_reduce"].alpha, measured.fits["all_reduce"].beta
    fit_rows(measured), identity_rows(measured), ring_tree_rows(link, ranks), link_rows(measured, sizes)

The ranks run ``hyper_parallel.benchmark.collectives.time_collectives`` as a ``%%torchrun`` cell runs its
code (``launch.notebook.magic.run_cell``: the same warm pool, no launch of its own); the largest world size
goes first, so the pool grows once and the smaller runs use its first ranks. The fit and the predictions
are ``hyper_parallel.cost_model.alpha_beta``'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from hyper_parallel.cost_model.alpha_beta import (
    LINKS,
    Fit,
    Link,
    cheaper_algorithm,
    fit,
    hops,
    ring_tree_crossover_bytes,
    samples_from_rows,
    wire,
)
from hyper_parallel.viz.style import fmt_bytes
from launch.notebook.magic import run_cell

SIZES = tuple(1 << k for k in range(10, 21, 2))
"""1 KiB to 1 MiB in factors of 4: latency-bound at the small end, bandwidth-bound at the large one."""
CODE = "from hyper_parallel.benchmark.collectives import time_collectives\ntime_collectives(sizes, repeats=repeats)\n"


@dataclass(frozen=True)
class Measured:
    """Every rank count's rows {op, n, bytes, seconds}, the ring identity rows, the fit per collective and
    the wall time the measurement took (pool start included)."""

    rows: list[dict]
    identity: list[dict]
    fits: dict[str, Fit]
    seconds: float

    def world_sizes(self) -> list[int]:
        return sorted({row["n"] for row in self.rows})


def measure_collectives(
    world_sizes: Sequence[int] = (4, 2), sizes: Sequence[int] = SIZES, repeats: int = 5, timeout: float = 300.0
) -> Measured:
    """Time the five collectives on each world size of the warm pool and fit alpha and beta to them."""
    if not world_sizes or min(world_sizes) < 2:
        raise ValueError(f"collectives need world sizes of 2 ranks or more, got {list(world_sizes)}")
    start = time.monotonic()
    rows, identity = [], []
    for n in sorted(set(world_sizes), reverse=True):  # the largest first: the pool grows once
        per_rank = run_cell(CODE, n, timeout, send={"sizes": [int(s) for s in sizes], "repeats": int(repeats)})
        rows += per_rank[0][0]  # the same on every rank: each time is the slowest rank's
        for index, row in enumerate(per_rank[0][1]):
            worst = max(rank_value[1][index]["max_abs_diff"] for rank_value in per_rank)
            identity.append({**row, "max_abs_diff": worst})
    return Measured(rows, identity, fit(samples_from_rows(rows)), time.monotonic() - start)


def fit_rows(measured: Measured) -> list[list[str]]:
    """One row per collective: alpha (us), beta (GB/s), and the fit's error over its samples."""
    return [
        [op, f"{f.alpha * 1e6:.1f}", f"{f.beta / 1e9:.2f}", str(f.samples), f"{f.rms_relative_error:.0%}"]
        for op, f in measured.fits.items()
    ]


def identity_rows(measured: Measured) -> list[list[str]]:
    """Per size and world size: the all-reduce's time against reduce-scatter + all-gather, in steps and
    bytes of the ring model and as measured."""
    rows = []
    for row in measured.identity:
        n, together = row["n"], row["reduce_scatter"] + row["all_gather"]
        rows.append(
            [
                str(n),
                fmt_bytes(row["bytes"]),
                f"{hops('all_reduce', n)} = {hops('reduce_scatter', n)} + {hops('all_gather', n)}",
                f"{wire('all_reduce', n):.3g} = {wire('reduce_scatter', n):.3g} + {wire('all_gather', n):.3g}",
                f"{row['all_reduce'] * 1e6:.0f}",
                f"{together * 1e6:.0f}",
                "yes" if row["max_abs_diff"] == 0 else f"no ({row['max_abs_diff']:.1e})",
            ]
        )
    return rows


def ring_tree_rows(link: Link, ranks: Sequence[int] = (8, 64, 1024)) -> list[list[str]]:
    """Ring against tree all-reduce on ``link``: steps (latency), bytes per byte of buffer (bandwidth) and the
    size where they cost the same."""
    rows = []
    for n in ranks:
        rows.append(
            [
                str(n),
                str(hops("all_reduce", n)),
                str(hops("all_reduce", n, "tree")),
                f"{wire('all_reduce', n):.3f}",
                f"{wire('all_reduce', n, 'tree'):.3f}",
                fmt_bytes(ring_tree_crossover_bytes(n, link.alpha, link.beta)),
                cheaper_algorithm(n, 1024, link),
                cheaper_algorithm(n, 1 << 30, link),
            ]
        )
    return rows


def here_link(measured: Measured, op: str = "all_reduce") -> Link:
    """This machine's fitted alpha and beta of ``op`` as a link."""
    f = measured.fits[op]
    return Link(f"this machine (gloo, {op} fit)", f.alpha, f.beta, "fitted here")


def link_rows(measured: Measured, sizes: Sequence[int] = (1024, 1 << 20, 1 << 30)) -> list[list[str]]:
    """A ring all-reduce of each size: here (4 ranks, the fit), a GPU node (8 on NVLink), a cluster (1024
    ranks across nodes on InfiniBand) and 8 GPUs on PCIe, each in ms."""
    here = max(measured.world_sizes())
    places = [
        (here_link(measured), here),
        (LINKS["nvlink"], 8),
        (LINKS["pcie"], 8),
        (LINKS["infiniband"], 1024),
    ]
    return [
        [f"{link.name}, {n} ranks", f"{link.alpha * 1e6:.3g}", f"{link.beta / 1e9:.3g}"]
        + [f"{link.seconds('all_reduce', n, size) * 1e3:.3g}" for size in sizes]
        for link, n in places
    ]
