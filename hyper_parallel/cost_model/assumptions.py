"""What every estimate takes for granted, in words, and where its calibration comes from: printed with
every plan and carried by every review format (text, Markdown, CSV, JSON, HTML), so no number stands
alone."""

from __future__ import annotations

from hyper_parallel.cost_model.hardware import Hardware
from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.cost_model.stacks import get_stack

CALIBRATION_SOURCES = (
    "h100-sxm gemm_efficiency fitted on the Llama 3 paper's Table 4, 405B on 8,192 H100 SXM (700 W): 430 TFLOP/s",
    "h100-hbm2e-500w gemm_efficiency fitted on torchtitan's benchmarks/llama3_h100_202412_torchtitan.md Table 1: "
    "Llama 3.1 8B, FSDP 8 on its 500 W HBM2e H100s, 5,762 (eager) and 6,667 (torch.compile) tokens/s/GPU",
    "a100 gemm_efficiency fitted on Narayanan et al. 2021 (Megatron-LM) Table 1, pipeline size 1 rows "
    "(1.7B-18.4B GPT, 135-142 TFLOP/s per GPU)",
    "validation against held-out runs (torchtitan, Megatron-LM, Llama 3, BLOOM, ZeRO, DeepSeek-V3): "
    "docs/planner_validation.md",
)


def assumptions(config: ModelConfig, hardware: Hardware) -> list[str]:
    p = config.precision
    bandwidth = hardware.bandwidth
    lines = [
        f"precision {p.name}: sharded parameters and gradients {p.storage} B/element, all-gathers and "
        f"activations {p.compute} B, gradient reduction {p.reduce} B, optimizer state {p.optimizer_state} B "
        f"per parameter element",
        f"memory: sharded state exact (padding included); activations estimated (activation checkpointing "
        f"{config.activation_checkpointing}, fused attention, the microbatches in flight of the schedule); "
        "see hyper_parallel.cost_model.memory and .stages",
        "communication: bytes per collective as traced (full buffers); EP rows assume balanced routing",
        "time per collective: " + bandwidth.describe(),
        "step: compute from the work (GEMMs by shape, attention, memory-bound kernels, optimizer; "
        "cost_model.work) on " + hardware.describe() + f"; range +-{hardware.band:.0%}; FSDP/HSDP collectives "
        "overlap compute (prefetch, async reduce-scatter), TP/CP/EP and pipeline sends are on the critical path "
        "(cost_model.step_time)",
    ]
    if config.pp_schedule != "1f1b" or config.virtual_stages > 1:
        lines.append(f"pipeline: {config.pp_schedule}, {config.virtual_stages} stage(s) per pp rank")
    lines.append(f"stack {config.stack}: {get_stack(config.stack).description} (cost_model.stacks)")
    if config.zero != 3:
        lines.append(f"ZeRO-{config.zero} over dp_shard: parameters whole on every rank (cost_model.memory)")
    return lines + ["calibration: " + source for source in CALIBRATION_SOURCES]
