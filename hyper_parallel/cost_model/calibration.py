"""Published training runs the planner is calibrated on and validated against, as data, with sources.

Every row names its source and what of its configuration is the source's and what is assumed (a paper
that does not state its micro-batch or schedule gets the assumption written in ``assumed``). Rows with
``calibrate=True`` fit one constant per machine, ``Hardware.gemm_efficiency``
(``fit_gemm_efficiency``: the value that makes the geometric mean of predicted / published over the
machine's calibration rows 1); the others are held out. docs/planner_validation.md is generated from
these rows by tests/test_planner_validation.py.

Sources (figures used as published; where the issue that asked for this work quotes a figure, it
is said so):
    torchtitan    pytorch/torchtitan docs/performance.md, Llama 3 8B on 8 H100, FSDP 8, bf16, local
                  batch 1, seq_len 8192, selective activation checkpointing: 5,762 tokens/s/GPU eager,
                  6,667 with torch.compile (both figures quoted in issue 27)
    megatron      Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
                  Using Megatron-LM", Table 1: GPT models on DGX A100 (80 GB), full activation
                  recomputation, seq 2048, vocab 51200, TFLOP/s per GPU counted with their eq. 3 (96 B s
                  L h^2 (...), recomputation included). The 39.1B and 1T rows (138 and 163) are quoted in
                  issue 27; the other rows' shapes and figures are taken from the same table as the author
                  knows it (not re-checked against the paper in this session: docs/planner_validation.md)
    llama3        Llama Team 2024, "The Llama 3 Herd of Models", Table 4: 405B on 8,192 H100, TP 8,
                  PP 16, DP 64, seq 8192, 16M tokens per batch: 430 TFLOP/s per GPU (quoted in issue 27)
    zero          Rajbhandari et al. 2020, "ZeRO", Figure 1: a 7.5B model with Adam in mixed precision on
                  64 GPUs keeps 120 GB of model states per GPU without ZeRO and 1.9 GB with stage 3
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from hyper_parallel.cost_model import PRECISIONS, ModelConfig, estimate, get_model
from hyper_parallel.cost_model.hardware import Hardware, get_hardware
from hyper_parallel.cost_model.layouts import GIB
from hyper_parallel.cost_model.step_time import estimate_step
from hyper_parallel.mesh import ParallelDims

METRICS = {
    "tokens/s/GPU": "tokens per second per GPU",
    "TFLOP/s/GPU (eq. 3)": "Megatron's counted FLOPs per second per GPU, recomputation included",
    "TFLOP/s/GPU (model)": "model FLOPs (no recomputation) per second per GPU",
    "model-state GB": "parameters + gradients + optimizer state per GPU, 1e9 bytes",
}


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str  # a key of the module docstring's sources
    hardware: str
    model: ModelConfig
    dims: ParallelDims
    metric: str  # a key of METRICS
    published: float
    calibrate: bool = False
    assumed: str = ""  # what of the configuration is not the source's
    gpus_per_node: int = 8
    extra: dict = field(default_factory=dict)


def _gpt(name: str, h: int, heads: int, layers: int, batch: int) -> ModelConfig:
    """A Megatron GPT of Table 1: feed-forward 4h, GELU, biases, learned positions, tied head, seq 2048, vocab
    51200, fp16 Adam, full recomputation, no sequence parallelism (2021); micro-batch 1 is assumed."""
    return ModelConfig(
        name,
        vocab_size=51200,
        d_model=h,
        n_heads=heads,
        n_layers=layers,
        ffn_hidden=4 * h,
        seq_len=2048,
        global_batch=batch,
        precision=PRECISIONS["bf16-adam"],
        activation_checkpointing="full",
        sequence_parallel=False,
        micro_batch=1,
        tied_embeddings=True,
        linear_bias=True,
        position_embeddings=2048,
    )


# name, h, heads, layers, tp, pp, gpus, batch, published TFLOP/s per GPU (Table 1)
MEGATRON_TABLE_1 = (
    ("1.7B", 2304, 24, 24, 1, 1, 32, 512, 137),
    ("3.6B", 3072, 32, 30, 2, 1, 64, 512, 138),
    ("7.5B", 4096, 32, 36, 4, 1, 128, 512, 142),
    ("18.4B", 6144, 48, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 8192, 64, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 10240, 80, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 12288, 96, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 16384, 128, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 20480, 128, 105, 8, 35, 2520, 2520, 163),
    ("1T", 25600, 160, 128, 8, 64, 3072, 3072, 163),
)


def _megatron_rows() -> list[PublishedRun]:
    rows = []
    for name, h, heads, layers, tp, pp, gpus, batch, tflops in MEGATRON_TABLE_1:
        dp = gpus // (tp * pp)
        rows.append(
            PublishedRun(
                f"Megatron GPT {name}, {gpus} A100, TP {tp} x PP {pp} x DP {dp}",
                "megatron",
                "a100-8",
                _gpt(f"gpt-{name}", h, heads, layers, batch),
                ParallelDims(world_size=gpus, dp_replicate=dp, dp_shard=1, tp=tp, pp=pp),
                "TFLOP/s/GPU (eq. 3)",
                tflops,
                calibrate=pp == 1,
                assumed="micro-batch 1, 1F1B without interleaving, DDP gradient all-reduce",
            )
        )
    return rows


def _torchtitan_rows() -> list[PublishedRun]:
    model = get_model("llama-8b-like").replace(global_batch=8, activation_checkpointing="op")
    dims = ParallelDims(world_size=8)
    note = "selective AC is torchtitan's per-op one (AC mode op)"
    return [
        PublishedRun(
            "torchtitan Llama 3 8B, 8 H100, FSDP 8, eager",
            "torchtitan",
            "h100-nvl8-ndr",
            model,
            dims,
            "tokens/s/GPU",
            5762,
            calibrate=True,
            assumed=note,
        ),
        PublishedRun(
            "torchtitan Llama 3 8B, 8 H100, FSDP 8, torch.compile",
            "torchtitan",
            "h100-nvl8-ndr",
            model,
            dims,
            "tokens/s/GPU",
            6667,
            calibrate=True,
            assumed=note + "; compilation (fused elementwise kernels) is not modelled: both rows get one prediction",
        ),
    ]


def _llama3_rows() -> list[PublishedRun]:
    model = get_model("llama-405b-like").replace(
        name="llama-405b-like (128 layers)",
        n_layers=128,
        global_batch=2048,
        micro_batch=1,
        pp_schedule="interleaved_1f1b",
        virtual_stages=2,
        reshard_after_forward=False,
    )
    return [
        PublishedRun(
            "Llama 3 405B, 8,192 H100, TP 8 x PP 16 x DP 64",
            "llama3",
            "h100-nvl8-ndr",
            model,
            ParallelDims(world_size=8192, dp_shard=64, tp=8, pp=16),
            "TFLOP/s/GPU (model)",
            430,
            assumed="128 layers for 126 (the paper drops one layer from the first and last stages), "
            "interleaved 1F1B with 2 stages per rank, micro-batch 1, no activation checkpointing, FSDP without "
            "resharding after forward",
        )
    ]


def _zero_rows() -> list[PublishedRun]:
    model = _gpt("gpt-7.5B (ZeRO's)", 4096, 32, 36, 64).replace(activation_checkpointing="none")
    return [
        PublishedRun(
            "ZeRO 7.5B, 64 GPUs, no sharding (DDP)",
            "zero",
            "a100-8",
            model.replace(param_shard=False, micro_batch=None),
            ParallelDims(world_size=64, dp_replicate=64, dp_shard=1),
            "model-state GB",
            120,
            assumed="Megatron's 7.5B GPT shape (7.47e9 parameters) for ZeRO's 7.5B",
        ),
        PublishedRun(
            "ZeRO 7.5B, 64 GPUs, stage 3 (FSDP 64)",
            "zero",
            "a100-8",
            model.replace(micro_batch=None),
            ParallelDims(world_size=64),
            "model-state GB",
            1.9,
            assumed="Megatron's 7.5B GPT shape (7.47e9 parameters) for ZeRO's 7.5B",
        ),
    ]


def published_runs() -> list[PublishedRun]:
    return _torchtitan_rows() + _megatron_rows() + _llama3_rows() + _zero_rows()


def predict(run: PublishedRun, hardware: Hardware | None = None) -> float:
    """The planner's value of ``run.metric`` for the run (on ``hardware``, default the run's preset)."""
    hardware = hardware or get_hardware(run.hardware)
    cost = estimate(run.model, run.dims)
    if run.metric == "model-state GB":
        m = cost.memory
        return (m.parameters + m.gradients + m.optimizer) / 1e9
    step = estimate_step(cost, run.gpus_per_node, hardware)
    if run.metric == "tokens/s/GPU":
        return run.model.global_batch * run.model.seq_len / run.dims.world_size / step.seconds
    flops = step.flops.total if run.metric == "TFLOP/s/GPU (eq. 3)" else step.flops.model
    return flops / step.seconds / 1e12


def memory_gib(run: PublishedRun) -> float:
    return estimate(run.model, run.dims).memory.total / GIB


def fit_gemm_efficiency(hardware_name: str, runs: list[PublishedRun] | None = None) -> float:
    """The ``gemm_efficiency`` that makes the geometric mean of predicted / published throughput over
    ``hardware_name``'s calibration rows 1 (bisection: throughput grows with the efficiency)."""
    rows = [r for r in (runs or published_runs()) if r.calibrate and r.hardware == hardware_name]
    if not rows:
        raise ValueError(f"no calibration rows for {hardware_name!r}")
    base = get_hardware(hardware_name)

    def log_ratio(efficiency: float) -> float:
        machine = dataclasses.replace(base, gemm_efficiency=efficiency)
        return sum(math.log(predict(r, machine) / r.published) for r in rows) / len(rows)

    low, high = 0.05, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if log_ratio(mid) < 0 else (low, mid)
    return (low + high) / 2
