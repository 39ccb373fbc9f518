"""Machines the planner times a step on: peak compute, link bandwidths, memory and what a run reaches.

    h100-nvl8-ndr   8 x H100 SXM per node on NVLink 4, one 400 Gb/s NDR InfiniBand NIC per GPU
    a100-8          8 x A100 SXM 80 GB per node on NVLink 3, one 200 Gb/s HDR NIC per GPU
    legacy          the planner's earlier defaults (150 / 25 GB/s) on H100 compute, for comparison

Peak: dense bf16 tensor-core TFLOPS of the data sheet (H100 SXM 989, A100 312), what MFU divides by.
Bandwidths are per rank and per direction as NCCL ring collectives reach them (bus bandwidth, below the
link's nominal 450 / 300 GB/s NVLink and 50 / 25 GB/s NIC): 360 and 45 GB/s on H100 + NDR, 230 and
22 GB/s on A100 + HDR. ``efficiency`` is the fraction of peak the step's counted FLOPs run at when
nothing waits for communication (kernel efficiency, the uncounted elementwise work, launch gaps):
0.40 to 0.60 gives the step-time range (published large runs report 38-43 % MFU for Llama 3 405B on
H100, 46 % for PaLM 540B on TPU v4; smaller models reach more).

Memory: what the framework sees (an H100 80 GB shows 81559 MiB = 79.6 GiB), minus ``reserve_gib`` for
the CUDA context, NCCL buffers and allocator fragmentation (not in the memory model): a plan fits
when its modelled peak stays within ``memory_gib - reserve_gib``.
"""

from __future__ import annotations

import dataclasses
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
    efficiency: tuple[float, float] = (0.40, 0.60)

    def __post_init__(self) -> None:
        low, high = self.efficiency
        if not 0 < low <= high <= 1:
            raise ValueError(f"efficiency must be 0 < low <= high <= 1, got {self.efficiency}")
        for name in ("peak_tflops", "intra_node_gbs", "inter_node_gbs", "memory_gib"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
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
        """The same machine with some numbers changed (``None`` values are ignored); named 'custom'."""
        changes = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, name="custom", **changes) if changes else self

    def describe(self) -> str:
        low, high = self.efficiency
        return (
            f"{self.name}: {self.peak_tflops:g} TFLOPS peak per GPU at {low:.0%}-{high:.0%} efficiency, "
            f"{self.intra_node_gbs:g} GB/s per rank inside a node, {self.inter_node_gbs:g} GB/s across nodes, "
            f"{self.memory_gib:g} GiB per GPU of which {self.reserve_gib:g} GiB reserved"
        )


HARDWARE = {
    h.name: h
    for h in [
        Hardware("h100-nvl8-ndr", peak_tflops=989.0, intra_node_gbs=360.0, inter_node_gbs=45.0, memory_gib=79.6),
        Hardware("a100-8", peak_tflops=312.0, intra_node_gbs=230.0, inter_node_gbs=22.0, memory_gib=80.0),
        Hardware("legacy", peak_tflops=989.0, intra_node_gbs=150.0, inter_node_gbs=25.0, memory_gib=80.0),
    ]
}
DEFAULT_HARDWARE = HARDWARE["h100-nvl8-ndr"]


def get_hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
    return HARDWARE[name]
