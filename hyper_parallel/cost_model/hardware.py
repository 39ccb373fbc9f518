"""Machines the planner times a step on: peak compute, memory bandwidth, link bandwidths, memory, and the
constants of the step-time model (``cost_model.work``) calibrated once on published runs.

    h100-nvl8-ndr   8 x H100 SXM 80 GB per node on NVLink 4, one 400 Gb/s NDR InfiniBand NIC per GPU
                    (torchtitan's benchmark machines; the Llama 3 405B cluster, 400 Gb/s RoCE per GPU)
    a100-8          8 x A100 SXM 80 GB per node on NVLink 3, one 200 Gb/s HDR NIC per GPU (the DGX A100
                    cluster of Narayanan et al. 2021, 8 HDR NICs per node)
    legacy          the planner's earlier defaults (150 / 25 GB/s) on H100 compute, for comparison

Data-sheet numbers: dense bf16 tensor-core peak (H100 SXM 989 TFLOPS, A100 312), what MFU divides by;
HBM bandwidth (H100 SXM 3.35 TB/s, A100 80 GB 2.04 TB/s). Link bandwidths are per rank and per
direction as NCCL ring collectives reach them (bus bandwidth, below the link's nominal 450 / 300 GB/s
NVLink and 50 / 25 GB/s NIC): 360 and 45 GB/s on H100 + NDR, 230 and 22 GB/s on A100 + HDR.

Step-time constants (``cost_model.work`` says how they are used):
    gemm_efficiency   the fraction of peak a large bf16 GEMM reaches; a GEMM of shape (m, n, k) reaches
                      gemm_efficiency x f(m) f(n) f(k), f(x) = x / (x + tile). Calibrated once, by
                      ``cost_model.calibration.fit_gemm_efficiency`` (tests/test_planner_validation.py
                      re-fits it and checks the constant below): H100 on torchtitan's Llama-3-8B FSDP
                      bf16 run on 8 H100 (5,762 tokens/s/GPU, eager), A100 on Narayanan et al. 2021
                      Table 1's rows with pipeline size 1 (1.7B, 3.6B, 7.5B, 18.4B)
    tile              128: the tensor-core tile edge; an axis of 128 runs at half the efficiency
                      (an assumption of the model, not fitted)
    memory_efficiency 0.8 of the HBM bandwidth for memory-bound kernels (norms, elementwise, the optimizer
                      step; an assumption, not fitted)
``band``: the plan prints its step time with a range of +-band (0.2: the validation's goal, see
docs/planner_validation.md), fast end to slow end.

Memory: what the framework sees (an H100 80 GB shows 81559 MiB = 79.6 GiB), minus ``reserve_gib`` for
the CUDA context, NCCL buffers and allocator fragmentation (not in the memory model): a plan fits
when its modelled peak stays within ``memory_gib - reserve_gib``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from hyper_parallel.cost_model.layouts import GIB, Bandwidth


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_tflops: float  # dense bf16 per GPU
    intra_node_gbs: float  # GB/s per rank inside a node
    inter_node_gbs: float  # GB/s per rank for groups spanning nodes
    memory_gib: float  # per GPU, as the framework sees it
    reserve_gib: float = 8.0  # not modelled: context, NCCL buffers, fragmentation
    hbm_tbs: float = 3.35  # HBM bandwidth, TB/s
    gemm_efficiency: float = 0.7  # calibrated (module docstring)
    tile: float = 128.0
    memory_efficiency: float = 0.8
    band: float = 0.2

    def __post_init__(self) -> None:
        if not (0 < self.gemm_efficiency <= 1 and 0 < self.memory_efficiency <= 1 and 0 <= self.band < 1):
            raise ValueError(
                f"gemm_efficiency and memory_efficiency must be in (0, 1] and band in [0, 1), got "
                f"{self.gemm_efficiency}, {self.memory_efficiency}, {self.band}"
            )
        for name in ("peak_tflops", "intra_node_gbs", "inter_node_gbs", "memory_gib", "hbm_tbs", "tile"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
        if not 0 <= self.reserve_gib < self.memory_gib:
            raise ValueError(
                f"the memory reserve ({self.reserve_gib} GiB) must be >= 0 and below the memory ({self.memory_gib} GiB)"
            )

    @property
    def bandwidth(self) -> Bandwidth:
        return Bandwidth(self.intra_node_gbs * 1e9, self.inter_node_gbs * 1e9)

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def budget_bytes(self) -> float:
        """The memory a plan may use: memory_gib - reserve_gib."""
        return (self.memory_gib - self.reserve_gib) * GIB

    def replace(self, **changes) -> Hardware:
        """The same machine with some numbers changed (``None`` values are ignored); named 'custom'.
        ``ValueError`` for a number that is not finite and positive, with this preset's value as the
        nearest valid one."""
        changes = {k: v for k, v in changes.items() if v is not None}
        for name, value in changes.items():
            low = 0 if name == "reserve_gib" else None
            if not math.isfinite(value) or (value < 0 if low == 0 else value <= 0):
                flag = "memory-reserve-gib" if name == "reserve_gib" else name.replace("_", "-")
                raise ValueError(
                    f"--{flag} must be a finite number {'>= 0' if low == 0 else '> 0'}, got {value}; nearest valid "
                    f"--{flag}: {getattr(self, name):g} (the {self.name} preset's)"
                )
        return dataclasses.replace(self, name="custom", **changes) if changes else self

    @property
    def hbm_bytes_per_second(self) -> float:
        return self.hbm_tbs * 1e12

    def describe(self) -> str:
        return (
            f"{self.name}: {self.peak_tflops:g} TFLOPS peak per GPU, large GEMMs at {self.gemm_efficiency:.0%} of it "
            f"(calibrated), HBM {self.hbm_tbs:g} TB/s at {self.memory_efficiency:.0%}, "
            f"{self.intra_node_gbs:g} GB/s per rank inside a node, {self.inter_node_gbs:g} GB/s across nodes, "
            f"{self.memory_gib:g} GiB per GPU of which {self.reserve_gib:g} GiB reserved"
        )


H100_GEMM_EFFICIENCY = (
    0.480  # fitted on torchtitan Llama-3-8B FSDP8 bf16 on 8 H100: 5,762 (eager), 6,667 (compiled) tokens/s/GPU
)
A100_GEMM_EFFICIENCY = 0.702  # fitted on Narayanan et al. 2021 Table 1, the pipeline-size-1 rows (1.7B-18.4B)
HARDWARE = {
    h.name: h
    for h in [
        Hardware(
            "h100-nvl8-ndr",
            peak_tflops=989.0,
            intra_node_gbs=360.0,
            inter_node_gbs=45.0,
            memory_gib=79.6,
            hbm_tbs=3.35,
            gemm_efficiency=H100_GEMM_EFFICIENCY,
        ),
        Hardware(
            "a100-8",
            peak_tflops=312.0,
            intra_node_gbs=230.0,
            inter_node_gbs=22.0,
            memory_gib=80.0,
            hbm_tbs=2.04,
            gemm_efficiency=A100_GEMM_EFFICIENCY,
        ),
        Hardware(
            "legacy",
            peak_tflops=989.0,
            intra_node_gbs=150.0,
            inter_node_gbs=25.0,
            memory_gib=80.0,
            hbm_tbs=3.35,
            gemm_efficiency=H100_GEMM_EFFICIENCY,
        ),
    ]
}
DEFAULT_HARDWARE = HARDWARE["h100-nvl8-ndr"]


def get_hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
    return HARDWARE[name]
