"""Machines the planner times a step on: which part (power, memory), peak compute, memory bandwidth, link
bandwidths, memory, and the constants of the step-time model (``cost_model.work``) calibrated on published
runs of that part.

    h100-sxm          8 x H100 SXM5 80 GB HBM3 at 700 W per node, NVLink 4, 400 Gb/s per GPU across nodes
                      (the Llama 3 405B cluster: "16K H100 GPUs, each running at 700W TDP with 80GB HBM3",
                      Llama 3 paper section 3.3.1, RoCE at 400 Gbps between GPUs)
    h100-hbm2e-500w   8 x H100 96 GB HBM2e (2.4 TB/s) at the default 500 W per host, NVLink, 400 Gb/s RDMA per
                      GPU: torchtitan's benchmark machines (benchmarks/llama3_h100_202412_torchtitan.md,
                      "Hardware"; its peak lies "between SXM and NVL", footnote 2: the SXM peak is the MFU
                      denominator here as there, and the calibrated efficiency absorbs the lower clock)
    h800              8 x H800 80 GB per node: DeepSeek-V3's cluster (report section 3.1; 3.2.2: NVLink 160 GB/s,
                      InfiniBand 50 GB/s per GPU); the H100 SXM's die and tensor-core peaks are assumed
    a100-sxm-80gb     8 x A100 SXM 80 GB per node on NVLink 3, one 200 Gb/s HDR NIC per GPU (Selene's DGX A100
                      of Narayanan et al. 2021, eight HDR InfiniBand NICs per node)
    a100-sxm-80gb-opa 8 x A100 80 GB per node on NVLink, four 100 Gb/s Omni-Path links per node (Jean Zay, the
                      BLOOM run: bigscience-workshop/bigscience train/tr11-176B-ml/README.md, "Hardware")
    legacy            the planner's earlier defaults (150 / 25 GB/s) on H100 SXM compute, for comparison

Data-sheet numbers: dense tensor-core peak (H100 SXM bf16 989 TFLOPS, fp8 1979; A100 bf16 312), what MFU
divides by; HBM bandwidth (H100 SXM 3.35 TB/s, A100 80 GB 2.04 TB/s). Link bandwidths are per rank and
per direction as NCCL ring collectives reach them (bus bandwidth, below the link's nominal 450 / 300 GB/s
NVLink and 50 / 25 GB/s NIC): 360 and 45 GB/s on H100 + 400 Gb/s, 230 and 22 GB/s on A100 + HDR; the
DeepSeek-V3 report's 160 GB/s NVLink on the H800; 4 x 100 Gb/s over 8 GPUs (at 90 %) on Jean Zay.

Step-time constants (``cost_model.work`` says how they are used):
    gemm_efficiency   the fraction of peak a large GEMM reaches; a GEMM of shape (m, n, k) reaches
                      gemm_efficiency x f(m) f(n) f(k), f(x) = x / (x + tile). Calibrated per part by
                      ``cost_model.calibration.fit_gemm_efficiency`` on the runs marked "calibration" for it
                      (docs/planner_validation.md names them; tests/test_planner_validation.py re-fits and
                      checks the constants below); a part without runs of its own borrows its die's (the H800
                      the H100 SXM's, Jean Zay's A100 Selene's)
    tile              128: the tensor-core tile edge; an axis of 128 runs at half the efficiency
                      (an assumption of the model, not fitted)
    memory_efficiency 0.8 of the HBM bandwidth for memory-bound kernels (norms, elementwise, the optimizer
                      step; an assumption, not fitted)
``band``: the plan prints its step time with a range of +-band (0.2: the validation's goal, see
docs/planner_validation.md), fast end to slow end.

Memory: what the framework sees (an H100 80 GB shows 81559 MiB = 79.6 GiB), minus ``reserve_gib`` for
what the memory model leaves out: the CUDA context and NCCL's buffers (1 GiB assumed). The
allocator's caching belongs to the peaks the memory model is held to (torchtitan publishes
``max_reserved``). A plan fits when its modelled peak stays within ``memory_gib - reserve_gib``.
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
    reserve_gib: float = 1.0  # not modelled: the CUDA context, NCCL buffers
    hbm_tbs: float = 3.35  # HBM bandwidth, TB/s
    gemm_efficiency: float = 0.7  # calibrated (module docstring)
    tile: float = 128.0
    memory_efficiency: float = 0.8
    band: float = 0.2
    fp8_tflops: float = 0.0  # dense float8 per GPU (0: no float8 tensor cores)
    part: str = ""  # which GPU, its power and memory, and where the figures come from

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
    def fp8_peak_flops(self) -> float:
        """float8 GEMMs' peak; ``ValueError`` on a part without float8 tensor cores."""
        if not self.fp8_tflops:
            raise ValueError(
                f"{self.name} ({self.part or 'custom'}) has no float8 peak: --float8 needs an H100 or later"
            )
        return self.fp8_tflops * 1e12

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
            f"{self.name} ({self.part or 'custom numbers'}): {self.peak_tflops:g} TFLOPS bf16 peak per GPU"
            + (f" ({self.fp8_tflops:g} fp8)" if self.fp8_tflops else "")
            + f", large GEMMs at {self.gemm_efficiency:.0%} of it (calibrated), HBM {self.hbm_tbs:g} TB/s at "
            f"{self.memory_efficiency:.0%}, {self.intra_node_gbs:g} GB/s per rank inside a node, "
            f"{self.inter_node_gbs:g} GB/s across nodes, {self.memory_gib:g} GiB per GPU of which "
            f"{self.reserve_gib:g} GiB reserved"
        )


H100_SXM_GEMM_EFFICIENCY = 0.596  # fitted on Llama 3 405B on 8,192 H100 SXM (Table 4, first row): 430 TFLOP/s/GPU
H100_HBM2E_GEMM_EFFICIENCY = 0.476  # fitted on torchtitan's Llama 3.1 8B, FSDP 8 (its Table 1: 5,762 and 6,667)
A100_GEMM_EFFICIENCY = 0.698  # fitted on Narayanan et al. 2021 Table 1, the pipeline-size-1 rows (1.7B-18.4B)
_H100_SXM = Hardware(
    "h100-sxm",
    peak_tflops=989.0,
    fp8_tflops=1979.0,
    intra_node_gbs=360.0,
    inter_node_gbs=45.0,
    memory_gib=79.6,
    hbm_tbs=3.35,
    gemm_efficiency=H100_SXM_GEMM_EFFICIENCY,
    part="H100 SXM5, 700 W, 80 GB HBM3",
)
_A100 = Hardware(
    "a100-sxm-80gb",
    peak_tflops=312.0,
    intra_node_gbs=230.0,
    inter_node_gbs=22.0,
    memory_gib=79.2,
    hbm_tbs=2.04,
    gemm_efficiency=A100_GEMM_EFFICIENCY,
    part="A100 SXM4 80 GB, 400 W, HDR 200 Gb/s per GPU",
)
HARDWARE = {
    h.name: h
    for h in [
        _H100_SXM,
        dataclasses.replace(
            _H100_SXM,
            name="h100-hbm2e-500w",
            memory_gib=89.4,
            hbm_tbs=2.4,
            gemm_efficiency=H100_HBM2E_GEMM_EFFICIENCY,
            part="H100 96 GB HBM2e, 500 W power limit, peak below the SXM's",
        ),
        dataclasses.replace(
            _H100_SXM, name="h800", intra_node_gbs=160.0, part="H800 SXM 80 GB, NVLink cut to 160 GB/s"
        ),
        _A100,
        dataclasses.replace(
            _A100,
            name="a100-sxm-80gb-opa",
            inter_node_gbs=4 * 12.5 * 0.9 / 8,
            part="A100 80 GB, 4 x 100 Gb/s Omni-Path per node of 8",
        ),
        dataclasses.replace(
            _H100_SXM,
            name="legacy",
            intra_node_gbs=150.0,
            inter_node_gbs=25.0,
            memory_gib=80.0,
            part="H100 SXM compute, the planner's earlier link defaults",
        ),
    ]
}
DEFAULT_HARDWARE = HARDWARE["h100-sxm"]


def get_hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
    return HARDWARE[name]
