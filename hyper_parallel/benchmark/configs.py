"""The benchmark's configurations and the statistics of its results, without torch.

Every configuration trains the same mini transformer twice, once under our ``fully_shard`` and once
under ``torch.distributed.fsdp.fully_shard``; the launcher validates the world size and summarises
``bench.json`` in the parent process, which never imports torch. The dense configurations give both the
same mesh. The multi-dim one (S2's shape: TP + SP, EP + ETP, one MoE layer) builds the model as the
recipe does and gives each stack the meshes its own users write: ours the ParallelDims views the recipe
hands ``fully_shard`` (``(dp_replicate=1, fsdp, tp)``, experts ``(dp_replicate=1, efsdp=1)``), torch's
FSDP2 the data dims > 1 (``fsdp``; experts on ``efsdp``, as torchtitan keeps it); there the first step,
which pays DTensor's uncached sharding propagation, is what differs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from hyper_parallel.mesh_dims import degrees_label

BENCH_FILE = "bench.json"
IMPLEMENTATIONS = ("ours", "torch")


@dataclass(frozen=True)
class BenchModel:
    """The mini transformer's size: big enough that a step is compute and communication (tens of ms
    on a 2-core CPU), not Python overhead; small enough for 4 ranks on 2 cores."""

    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    hidden: int = 512
    vocab_size: int = 2048
    seq_len: int = 64
    global_batch: int = 8
    num_experts: int = 4  # the MoE layer of the multi-dim configuration (layer 1, top-2, a shared expert)
    moe_hidden: int = 128

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


TP_STYLES = ("tp", "sp", "async")
"""How a configuration applies tensor parallelism to both implementations: ``tp`` torch's styles without
SP, ``sp`` with SP (``parallelize_module`` with ``SequenceParallel``), ``async`` ours pipelined
(``parallel.async_tp``) against torch's TP+SP: the one configuration whose two sides differ in TP too."""


@dataclass(frozen=True)
class BenchConfig:
    name: str
    title: str
    degrees: dict[str, int]  # ParallelDims keyword arguments, world_size included
    tp_style: str = "tp"  # one of TP_STYLES
    optional: bool = False  # run only when named (--configs): the default set stays the FSDP comparison

    @property
    def experts(self) -> bool:
        """The multi-dim configuration: a MoE layer whose experts EP (and ETP) spread (module docstring)."""
        return self.degrees.get("ep", 1) > 1

    @property
    def world_size(self) -> int:
        return self.degrees["world_size"]

    @property
    def loss_rtol(self) -> float:
        """How far the two implementations' losses may differ: 0 where both run the same operations in the
        same order (bit for bit), fp32 rounding where they sum in another order: S2's norm weights, Partial
        over tp under SP (ours sums them in fully_shard, FSDP2 in DTensor), and async TP's chunked matmuls."""
        return 1e-5 if self.experts or self.tp_style == "async" else 0.0


def _tensor_parallel_configs(world_size: int) -> list[BenchConfig]:
    """TP+SP (our fully_shard + torch's TP+SP against FSDP2 + torch's TP+SP: the same TP on both sides) and
    AsyncTP (our fully_shard + async TP against the same torch stack). Their ratios against one baseline
    give async against synchronous TP+SP: ratio(AsyncTP) / ratio(TP+SP) (``async_tp_ratio``)."""
    degrees = {"world_size": world_size, "dp_shard": world_size // 2, "tp": 2}
    mesh = degrees_label(degrees, sep=" x ")
    return [
        BenchConfig("TP+SP", f"torch's TP+SP under both, {mesh}", degrees, tp_style="sp", optional=True),
        BenchConfig(
            "AsyncTP", f"ours: async TP+SP; torch: its TP+SP, {mesh}", degrees, tp_style="async", optional=True
        ),
    ]


def async_tp_ratio(rows: list[dict[str, Any]]) -> float | None:
    """Async TP+SP's step time over synchronous TP+SP's, both under our fully_shard: the two configurations'
    median ratios against the same torch stack divided (the baseline cancels); None unless both ran."""
    by_name = {row["config"]: row for row in rows}
    if "AsyncTP" not in by_name or "TP+SP" not in by_name:
        return None
    return by_name["AsyncTP"]["ratio"]["median"] / by_name["TP+SP"]["ratio"]["median"]


def configurations(world_size: int, include_optional: bool = True) -> list[BenchConfig]:
    """FSDP on every rank; HSDP and FSDP+TP need a second mesh dim, so 4 ranks (2 x 2); TP+SP and AsyncTP
    (optional: run when named) on tp=2, with dp_shard=2 on 4 ranks."""
    if world_size not in (2, 4):
        raise ValueError(f"the benchmark runs on 2 or 4 ranks (--world 2|4), got {world_size}")
    configs = [
        BenchConfig("FSDP", f"FSDP 1-D, dp_shard={world_size}", {"world_size": world_size, "dp_shard": world_size})
    ]
    if world_size == 4:
        configs.append(
            BenchConfig(
                "HSDP", "HSDP, dp_replicate=2 x dp_shard=2", {"world_size": 4, "dp_replicate": 2, "dp_shard": 2}
            )
        )
        configs.append(
            BenchConfig("FSDP+TP", "FSDP + TP, dp_shard=2 x tp=2", {"world_size": 4, "dp_shard": 2, "tp": 2})
        )
        configs.append(
            BenchConfig(
                "S2",
                "multi-dim (S2): dp_shard=2 x tp=2 + SP, ep=2 x etp=2; each stack on its own users' meshes",
                {"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2, "etp": 2},
            )
        )
    configs += _tensor_parallel_configs(world_size)
    return [c for c in configs if include_optional or not c.optional]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ratios(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    ratios = sorted(a / b for a, b in zip(ours, theirs))
    quartile = len(ratios) // 4
    return {
        "median": median(ratios),
        "q1": ratios[quartile] if ratios else float("nan"),
        "q3": ratios[-1 - quartile] if ratios else float("nan"),
        "pairs": len(ratios),
    }


def summarize(config_result: dict[str, Any]) -> dict[str, Any]:
    """One configuration's row: median step times, the median of the pairwise ratios ours/torch (pairs
    are adjacent steps, so a slow phase of a loaded machine hits both) with their quartiles, the same
    for forward + backward alone (where the two implementations differ; the optimizer is the same
    code on the same DTensors) and peak memory per implementation. The first step of each (DTensor's
    caches cleared before it, as a fresh run starts) and the median ratio of the
    cold pairs (caches cleared before every step). Communication is read from the traced step's files by
    the launcher (``launch.bench.fsdp2``)."""
    step, forward_backward = config_result["step_times"], config_result["forward_backward_times"]
    first, cold = config_result["first_step_times"], config_result["cold_step_times"]
    return {
        "config": config_result["name"],
        "title": config_result["title"],
        "first_ms": {impl: 1e3 * first[impl] for impl in IMPLEMENTATIONS},
        "first_ratio": first["ours"] / first["torch"],
        "cold_ms": {impl: 1e3 * median(cold[impl]) for impl in IMPLEMENTATIONS},
        "cold_ratio": _ratios(cold["ours"], cold["torch"]),
        "median_ms": {impl: 1e3 * median(step[impl]) for impl in IMPLEMENTATIONS},
        "ratio": _ratios(step["ours"], step["torch"]),
        "forward_backward_ms": {impl: 1e3 * median(forward_backward[impl]) for impl in IMPLEMENTATIONS},
        "forward_backward_ratio": _ratios(forward_backward["ours"], forward_backward["torch"]),
        "peak_memory": config_result["peak_memory"],
        "max_loss_diff": config_result.get("max_loss_diff"),
    }
