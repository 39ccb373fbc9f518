"""Published training runs the planner is calibrated on and validated against, as data, with sources.

Every row names its source (``SOURCES``: paper or file, table, version) and what of its configuration is
the source's and what is assumed (``assumed``). Rows with ``calibrate=True`` fit one constant per part,
``Hardware.gemm_efficiency`` (``fit_gemm_efficiency``: the value that makes the geometric mean of
predicted / published over the part's calibration rows 1); every other row is held out and only
predicted. docs/planner_validation.md is rendered from these rows (``validation_doc``); the published
runs' layouts are ranked there among every layout their stack can run (``ranking.rank_layouts``).

The runs are costed by what they ran: their hardware preset (``hardware``), their stack (``stacks``: what
Megatron-LM, DeepSpeed, torchtitan or Meta's and DeepSeek's stacks do differently), their ZeRO stage,
schedule, stage split, activation checkpointing and precision, never by a factor per row.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from hyper_parallel.cost_model import PRECISIONS, ModelConfig, estimate, get_model
from hyper_parallel.cost_model.hardware import Hardware, get_hardware
from hyper_parallel.cost_model.layouts import GIB
from hyper_parallel.cost_model.step_time import estimate_step
from hyper_parallel.mesh import ParallelDims

METRICS = {
    "tokens/s/GPU": "tokens per second per GPU",
    "TFLOP/s/GPU (eq. 3)": "counted FLOPs per second per GPU, recomputation included (Megatron's eq. 3, BLOOM's "
    "'hardware TFLOPs')",
    "TFLOP/s/GPU (model)": "model FLOPs (no recomputation) per second per GPU",
    "model-state GB": "parameters + gradients + optimizer state per GPU, 1e9 bytes",
    "peak memory GiB": "the worst rank's peak memory, 2^30 bytes (torchtitan's max_reserved)",
    "memory GB": "memory per GPU as the source states it, 1e9 bytes",
}
MEMORY_METRICS = ("model-state GB", "peak memory GiB", "memory GB")
SOURCES = {
    "torchtitan": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370, torch 1963fc8, "
    "2024-12): Tables 1, 3, 4 and 5; the runs' seq_len 8192 from train_configs/llama3_*.toml at 9dec370, their "
    "pipeline split from torchtitan/parallelisms/pipelining_utils.py there (microbatches = pp by default)",
    "torchtitan-asynctp": "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (torchtitan 820504e, "
    "torch 38410cf, 2025-06): the bfloat16 rows",
    "megatron": "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM "
    "(SC '21), Table 1; hidden size, layers, model-parallel size, GPUs, batch and TFLOP/s as in NVIDIA/Megatron-LM's "
    "README at 50a4b5f (images/cases_april2021.png); heads and the TP x PP split as the table is transcribed in public "
    "notes (the paper's text was not readable here); DDP all-reduce after the backward (megatron/training.py at 50a4b5f)",
    "megatron-table2": "Narayanan et al. 2021, Table 2 (PTD-P against ZeRO-3 without model parallelism), as transcribed in "
    "public notes (the paper's text was not readable here)",
    "llama3": "Llama Team 2024, The Llama 3 Herd of Models (arXiv 2407.21783), Table 4 and section 3.3 (700 W H100 80 GB "
    "HBM3; FSDP sharding optimizer state and gradients without resharding after forward; first and last pipeline "
    "stage one layer short; no activation checkpointing at 8K)",
    "bloom": "bigscience-workshop/bigscience train/tr11-176B-ml/README.md and tr11-176B-ml.slurm (2022-07): TP 4, PP 12, "
    "384 A100 80 GB, micro-batch 2, global batch 2048, checkpointed activations, bf16 optimizer with its own ZeRO-1, "
    "embeddings counted as stages ('type:transformer|embedding'), 149.77 TFLOPs at the end of the first epoch; "
    "'60 GB of memory on each GPU' from BigScience's model page (bigscience.notion.site, BigScience 176B Model)",
    "zero": "Rajbhandari et al. 2020, ZeRO: Memory Optimizations Toward Training Trillion Parameter Models, Figure 1 "
    "(Psi = 7.5B, K = 12, Nd = 64: 120, 31.4, 16.6 and 1.9 GB per device)",
    "deepseek-v3": "DeepSeek-AI 2024, DeepSeek-V3 Technical Report (arXiv 2412.19437v2): 180K H800 GPU hours per "
    "trillion tokens (section 1, Table 1), 2048 H800, PP 16 with DualPipe, EP 64 over 8 nodes, ZeRO-1, no TP "
    "(3.2), FP8 GEMMs (3.3), sequence 4K and batch 15360 (4.2); shapes from deepseek-ai/DeepSeek-V3 "
    "inference/configs/config_671B.json (9b4e978)",
}


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str  # a key of SOURCES
    hardware: str
    model: ModelConfig
    dims: ParallelDims
    metric: str  # a key of METRICS
    published: float
    calibrate: bool = False
    assumed: str = ""  # what of the configuration is not the source's
    gpus_per_node: int = 8


def _gpt(name: str, h: int, heads: int, layers: int, batch: int, vocab: int = 51200) -> ModelConfig:
    """A GPT of Megatron's Table 1: feed-forward 4h, GELU, biases, learned positions, tied head, seq 2048, vocab
    51200, mixed precision with float32 main gradients, full recomputation, no sequence parallelism (2021)."""
    return ModelConfig(
        name,
        vocab_size=vocab,
        d_model=h,
        n_heads=heads,
        n_layers=layers,
        ffn_hidden=4 * h,
        seq_len=2048,
        global_batch=batch,
        precision=PRECISIONS["bf16-master"],
        activation_checkpointing="full",
        sequence_parallel=False,
        micro_batch=1,
        tied_embeddings=True,
        linear_bias=True,
        position_embeddings=2048,
        stack="megatron",
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
MEGATRON_ASSUMED = "micro-batch 1, 1F1B without interleaving (the table gives neither)"


def _megatron_rows() -> list[PublishedRun]:
    rows = []
    for name, h, heads, layers, tp, pp, gpus, batch, tflops in MEGATRON_TABLE_1:
        dp = gpus // (tp * pp)
        rows.append(
            PublishedRun(
                f"Megatron GPT {name}, {gpus} A100, TP {tp} x PP {pp} x DP {dp}",
                "megatron",
                "a100-sxm-80gb",
                _gpt(f"gpt-{name}", h, heads, layers, batch),
                ParallelDims(world_size=gpus, dp_replicate=dp, dp_shard=1, tp=tp, pp=pp),
                "TFLOP/s/GPU (eq. 3)",
                tflops,
                calibrate=pp == 1,
                assumed=MEGATRON_ASSUMED,
            )
        )
    return rows


def _megatron_table_2_rows() -> list[PublishedRun]:
    """PTD-P (TP 8 x PP 12 for GPT-3, 8 x 35 for 530B, micro-batch 1) and ZeRO-3 without model parallelism."""
    gpt3 = _gpt("gpt-174.6B (GPT-3)", 12288, 96, 96, 1536)
    big = _gpt("gpt-529.6B", 20480, 128, 105, 2240)
    rows = []
    for model, pp, gpus, tflops in ((gpt3, 12, 384, 153), (gpt3, 12, 768, 149), (gpt3, 12, 1536, 141)) + (
        (big, 35, 560, 171),
        (big, 35, 1120, 167),
        (big, 35, 2240, 159),
    ):
        dp = gpus // (8 * pp)
        rows.append(
            PublishedRun(
                f"Megatron PTD-P {model.name.removeprefix('gpt-')}, {gpus} A100, TP 8 x PP {pp} x DP {dp}",
                "megatron-table2",
                "a100-sxm-80gb",
                model,
                ParallelDims(world_size=gpus, dp_replicate=dp, dp_shard=1, tp=8, pp=pp),
                "TFLOP/s/GPU (eq. 3)",
                tflops,
                assumed="1F1B without interleaving (not given)",
            )
        )
    zero3 = {"stack": "deepspeed-zero3", "precision": PRECISIONS["fp16-master"]}
    for model, gpus, batch, micro, tflops in (
        (gpt3, 384, 1536, 4, 144),
        (gpt3, 1536, 1536, 1, 44),
        (big.replace(global_batch=2560), 640, 2560, 4, 138),
        (big, 2240, 2240, 1, 48),
    ):
        rows.append(
            PublishedRun(
                f"DeepSpeed ZeRO-3 {model.name.removeprefix('gpt-')}, {gpus} A100, FSDP {gpus}, micro-batch {micro}",
                "megatron-table2",
                "a100-sxm-80gb",
                model.replace(name=model.name + " ZeRO-3", global_batch=batch, micro_batch=micro, **zero3),
                ParallelDims(world_size=gpus),
                "TFLOP/s/GPU (eq. 3)",
                tflops,
                assumed="fp16 mixed precision (ZeRO's); full recomputation as the PTD-P runs",
            )
        )
    return rows


def _torchtitan_8b(batch: int, stack: str, float8: bool = False) -> ModelConfig:
    model = get_model("llama-8b-like").replace(global_batch=batch, activation_checkpointing="op", stack=stack)
    return model.replace(float8=float8)


def _torchtitan_rows() -> list[PublishedRun]:
    rows = []
    eager, compiled = "torchtitan", "torchtitan-compile"
    for gpus, table, runs in (
        (
            8,
            "Table 1",
            (
                (eager, False, 5762, 82.4, True),
                (compiled, False, 6667, 77.0, True),
                (compiled, True, 8532, 76.8, False),
            ),
        ),
        (
            128,
            "Table 3",
            (
                (eager, False, 5605, 67.0, False),
                (compiled, False, 6514, 62.0, False),
                (compiled, True, 8380, 61.8, False),
            ),
        ),
    ):
        for stack, float8, tps, gib, calibrate in runs:
            label = "eager" if stack == eager else "compile" + (" + float8" if float8 else "")
            model = _torchtitan_8b(2 * gpus, stack, float8)
            common = dict(calibrate=calibrate, assumed="selective AC is torchtitan's per-op one (the configs' 'op')")
            name = f"torchtitan Llama 3.1 8B, {gpus} H100, FSDP {gpus}, {label} ({table})"
            dims = ParallelDims(world_size=gpus)
            rows.append(PublishedRun(name, "torchtitan", "h100-hbm2e-500w", model, dims, "tokens/s/GPU", tps, **common))
            rows.append(
                PublishedRun(name, "torchtitan", "h100-hbm2e-500w", model, dims, "peak memory GiB", gib, **common)
            )
    seventy = get_model("llama-70b-like").replace(
        global_batch=512, activation_checkpointing="full", stack="torchtitan-compile", float8=True, loss_parallel=True
    )
    dims = ParallelDims(world_size=256, dp_shard=32, tp=8)
    for async_tp, tps, gib in ((False, 829, 71.9), (True, 876, 67.6)):
        name = (
            f"torchtitan Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, float8{' + async TP' if async_tp else ''} (Table 4)"
        )
        model = seventy.replace(async_tp=async_tp)
        rows.append(PublishedRun(name, "torchtitan", "h100-hbm2e-500w", model, dims, "tokens/s/GPU", tps))
        rows.append(PublishedRun(name, "torchtitan", "h100-hbm2e-500w", model, dims, "peak memory GiB", gib))
    big = get_model("llama-405b-like").replace(
        global_batch=256,
        activation_checkpointing="full",
        stack="torchtitan-compile",
        float8=True,
        async_tp=True,
        grad_accum=8,
        loss_parallel=True,
    )
    dims = ParallelDims(world_size=512, dp_shard=8, tp=8, pp=8)
    for schedule, virtual, tps, gib in (("1f1b", 1, 100, 82.5), ("interleaved_1f1b", 2, 128, 72.7)):
        name = f"torchtitan Llama 3.1 405B, 512 H100, FSDP 8 x TP 8 x PP 8, {schedule} (Table 5)"
        model = big.replace(pp_schedule=schedule, virtual_stages=virtual)
        note = "8 microbatches (torchtitan's default: the pp degree) of 4 rows; its generated uneven split"
        for metric, value in (("tokens/s/GPU", tps), ("peak memory GiB", gib)):
            rows.append(PublishedRun(name, "torchtitan", "h100-hbm2e-500w", model, dims, metric, value, assumed=note))
    return rows


def _torchtitan_async_tp_rows() -> list[PublishedRun]:
    compiled = {"stack": "torchtitan-compile", "loss_parallel": True}
    seventy = get_model("llama-70b-like").replace(global_batch=512, activation_checkpointing="full", **compiled)
    eight = get_model("llama-8b-like").replace(global_batch=96, activation_checkpointing="op", **compiled)
    rows = []
    for model, dims, label, published in (
        (seventy, ParallelDims(world_size=256, dp_shard=32, tp=8), "70B, 256 H100, FSDP 32 x TP 8", (597.3, 652.4)),
        (eight, ParallelDims(world_size=64, dp_shard=8, tp=8), "8B, 64 H100, FSDP 8 x TP 8", (4378, 4809.4)),
    ):
        for async_tp, tps in zip((False, True), published):
            rows.append(
                PublishedRun(
                    f"torchtitan Llama 3 {label}, bf16, {'async' if async_tp else 'vanilla'} TP",
                    "torchtitan-asynctp",
                    "h100-hbm2e-500w",
                    model.replace(async_tp=async_tp),
                    dims,
                    "tokens/s/GPU",
                    tps,
                    assumed="seq_len 8192 (torchtitan's configs); the table's tokens/sec read as per GPU",
                )
            )
    return rows


LLAMA3_STAGES = (0,) + (1,) * 126 + (0,)
"""Llama 3's split: the first stage holds only the embedding, the last only the output projection and loss
(section 3.3.2), so with 126 layers on PP 16 every other stage holds one layer: V = 8 stages per rank."""


def _llama3_rows() -> list[PublishedRun]:
    model = get_model("llama-405b-like").replace(
        name="llama-3.1-405b",
        global_batch=2048,
        micro_batch=1,
        pp_schedule="interleaved_1f1b",
        virtual_stages=8,
        stage_layers=LLAMA3_STAGES,
        reshard_after_forward=False,
        stack="llama3",
        loss_parallel=True,
    )
    assumed = (
        "micro-batch 1; interleaved 1F1B with 8 stages of one layer per rank (the paper: the first stage only the "
        "embedding, the last only the output and loss); loss over the vocabulary-sharded logits; under CP the "
        "K/V all-gathered again in backward rather than kept for it (the paper does not say; TransformerEngine's "
        "AttnFuncWithCPAndKVAllGather, written after its section 3.3.2, does)"
    )
    rows = []
    for gpus, cp, dp, seq, batch, tflops, calibrate in (
        (8192, 1, 64, 8192, 2048, 430, True),
        (16384, 1, 128, 8192, 2048, 400, False),
        (16384, 16, 8, 131072, 128, 380, False),
    ):
        rows.append(
            PublishedRun(
                f"Llama 3 405B, {gpus:,} H100, TP 8 x CP {cp} x PP 16 x DP {dp}, seq {seq:,}",
                "llama3",
                "h100-sxm",
                model.replace(seq_len=seq, global_batch=batch),
                ParallelDims(world_size=gpus, dp_shard=dp, cp=cp, tp=8, pp=16),
                "TFLOP/s/GPU (model)",
                tflops,
                calibrate=calibrate,
                assumed=assumed,
            )
        )
    return rows


def _bloom_rows() -> list[PublishedRun]:
    model = _gpt("bloom-176b", 14336, 112, 70, 2048, vocab=250880).replace(
        precision=PRECISIONS["bf16-deepspeed"],
        micro_batch=2,
        position_embeddings=0,
        embedding_norm=True,
        zero=1,
        stack="megatron-deepspeed",
        stage_layers=(5,) + (6,) * 10 + (5,),
        description="BLOOM-176B: 70 layers, d 14336, 112 heads, GELU 4h, ALiBi, vocab 250880 (padded)",
    )
    dims = ParallelDims(world_size=384, dp_shard=8, tp=4, pp=12)
    assumed = (
        "1F1B (DeepSpeed's pipeline engine); the embedding-weighted split as the README draws it; the 60 GB read as "
        "what a GPU showed (the allocator's reserve: the bfloat16 copy DeepSpeed's all-reduce makes of the float32 "
        "gradient buffer is reserved beside the activations' freed blocks)"
    )
    name = "BLOOM 176B, 384 A100, TP 4 x PP 12 x DP 8 (ZeRO-1)"
    return [
        PublishedRun(name, "bloom", "a100-sxm-80gb-opa", model, dims, metric, value, assumed=assumed)
        for metric, value in (("TFLOP/s/GPU (eq. 3)", 149.77), ("memory GB", 60))
    ]


def _zero_rows() -> list[PublishedRun]:
    model = _gpt("gpt-7.5B (ZeRO's)", 4096, 32, 36, 64).replace(
        activation_checkpointing="none", precision=PRECISIONS["fp16-master"], stack="torchtitan", micro_batch=None
    )
    rows = []
    for label, zero, dims, published in (
        ("no sharding (DDP)", 3, ParallelDims(world_size=64, dp_replicate=64, dp_shard=1), 120),
        ("ZeRO-1 (P_os)", 1, ParallelDims(world_size=64), 31.4),
        ("ZeRO-2 (P_os+g)", 2, ParallelDims(world_size=64), 16.6),
        ("ZeRO-3 (P_os+g+p)", 3, ParallelDims(world_size=64), 1.9),
    ):
        rows.append(
            PublishedRun(
                f"ZeRO 7.5B, 64 GPUs, {label}",
                "zero",
                "a100-sxm-80gb",
                model.replace(zero=zero),
                dims,
                "model-state GB",
                published,
                assumed="Megatron's 7.5B GPT shape (7.47e9 parameters) for ZeRO's Psi = 7.5e9",
            )
        )
    return rows


def deepseek_v3_model() -> ModelConfig:
    """DeepSeek-V3 as its report trained it (``SOURCES["deepseek-v3"]``), from the preset configs/deepseek-v3.json."""
    return get_model("deepseek-v3").replace(
        seq_len=4096,
        global_batch=15360,
        micro_batch=1,
        precision=PRECISIONS["fp8-deepseek"],
        zero=1,
        float8=True,
        pp_schedule="dualpipev",
        virtual_stages=2,
        stage_layers=(1,) + (2,) * 30 + (0,),
        stack="hai-llm",
    )


def _deepseek_rows() -> list[PublishedRun]:
    per_gpu = 1e12 / (180e3 * 3600)  # 180K H800 GPU hours per trillion tokens
    return [
        PublishedRun(
            "DeepSeek-V3 671B, 2048 H800, PP 16 (DualPipe) x EP 64 x DP 128 (ZeRO-1), FP8",
            "deepseek-v3",
            "h800",
            deepseek_v3_model(),
            ParallelDims(world_size=2048, dp_shard=128, pp=16, ep=64),
            "tokens/s/GPU",
            per_gpu,
            assumed="micro-batch 1 (120 microbatches per step); DualPipeV's bubble for DualPipe (same per its README, "
            "without DualPipe's second parameter copy); 32 stages of 2 layers, the first of 1 with the embedding, the last "
            "of none with the head and the MTP module (both on pp rank 0, as the report places them); the routing weights "
            "applied inside the fused SwiGLU, which is recomputed (3.3.3), so no expert output is kept for their "
            "gradient (the report does not say; Megatron-Core's weighted_bias_swiglu_impl does), and the router's "
            "input recomputed with the RMSNorm before it (3.2.3)",
        )
    ]


def published_runs() -> list[PublishedRun]:
    return (
        _torchtitan_rows()
        + _torchtitan_async_tp_rows()
        + _megatron_rows()
        + _megatron_table_2_rows()
        + _llama3_rows()
        + _bloom_rows()
        + _zero_rows()
        + _deepseek_rows()
    )


def predict(run: PublishedRun, hardware: Hardware | None = None) -> float:
    """The planner's value of ``run.metric`` for the run (on ``hardware``, default the run's preset)."""
    hardware = hardware or get_hardware(run.hardware)
    cost = estimate(run.model, run.dims)
    m = cost.memory
    if run.metric == "model-state GB":
        return (m.parameters + m.gradients + m.optimizer) / 1e9
    if run.metric == "peak memory GiB":
        return m.total / GIB
    if run.metric == "memory GB":
        return m.total / 1e9
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
    rows = [
        r
        for r in (runs or published_runs())
        if r.calibrate and r.hardware == hardware_name and r.metric not in MEMORY_METRICS
    ]
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
