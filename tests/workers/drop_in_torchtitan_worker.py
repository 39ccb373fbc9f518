"""torchrun worker for tests/test_drop_in_torchtitan.py: torchtitan's Llama3 debug model trained through
torchtitan's own ``parallelize_llama``, once as torchtitan ships it (torch FSDP2) and once with the
``fully_shard`` it calls replaced by ours, same seeds, same tokens, same AdamW.

What is torchtitan's and what is ours to decide here:

* torchtitan's: the model config (``model_registry("debugmodel")``), its seeding (``set_determinism``),
  ``ParallelDims`` and its meshes, ``parallelize_llama`` (TP plan, ``apply_fsdp_to_decoder``: one unit
  for ``tok_embeddings``, one for ``[norm, lm_head]``, one per block, the root, then
  ``disable_fsdp_gradient_division``), ``init_weights``, its sum-reduced ``CrossEntropyLoss`` divided by
  the global token count, and its ``clip_grad_norm_`` (max_norm 1.0). The optimizer is torch's AdamW
  with the hyper-parameters of torchtitan's ``default_adamw``.
* changed for a 4-rank CPU run in seconds: the first 2 of its 6 layers; causal SDPA (torchtitan's own
  ``ScaledDotProductAttention``) for its compiled FlexAttention, whose inductor build would take minutes;
  RoPE tables of ``SEQ`` positions (what the trainer's ``update_from_config`` does; calling that imports
  the whole trainer: datasets, tensorboard); ``spmd_backend="partial_dtensor"`` (DTensor TP + FSDP2, the
  path of every torchtitan release before 0.3; 0.3's default "spmd_types" wants every parameter a DTensor
  on the full mesh before fully_shard, set up by the trainer); ``parallel_dims.device_type`` = "cpu"
  (torchtitan assumes "cuda" when there is no accelerator).
* gloo has no PREMUL_SUM, which FSDP2 uses for the divide factor 1.0 torchtitan sets, so on gloo the
  FSDP2 arm is also told ``set_force_sum_reduction_for_comms(True)`` (the switch torchtitan's symmetric
  memory path sets): SUM, then a division by 1.0, the same numbers. Ours divides after a SUM anyway.

Per case the result holds, per arm, the global loss and the grad norm of every step, whether the root is
an ``FSDPModule`` and how many ``fully_shard`` calls parallelize made; and the largest absolute difference
ours vs FSDP2 of every gradient (before clipping, ``full_tensor()``) and of every parameter after the
last step. Output: ``OUT/torchtitan_rank{r}.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torchtitan.distributed.fsdp as titan_fsdp
import torchtitan.distributed.parallel_dims as titan_parallel_dims
from case_runner import run_cases
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.tensor import DTensor
from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.config.configs import DebugConfig
from torchtitan.distributed import ParallelDims
from torchtitan.distributed import utils as titan_dist
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.sharding import set_llama3_sharding_config

from hyper_parallel.fsdp import fully_shard as our_fully_shard

STEPS = 3
BATCH, SEQ = 8, 32  # global batch of token rows; each data-parallel rank takes BATCH / dp of them
LAYERS = 2
SEED = 0
ADAMW = {"lr": 8e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}  # torchtitan's default_adamw
MAX_NORM = 1.0  # torchtitan's TrainingConfig.max_norm


@dataclass(frozen=True)
class Case:
    """One way of building the model: torchtitan's TP degree (FSDP takes the rest of the 4 ranks), meta
    initialisation (the trainer's way: build on meta, parallelize, ``to_empty``, ``init_weights``) or
    on the CPU before parallelize, and the mixed-precision parameter dtype."""

    tp: int = 1
    meta_init: bool = False
    param_dtype: str = "float32"


CASES = {
    "fsdp4": Case(),
    "fsdp4_bf16_params": Case(param_dtype="bfloat16"),  # torchtitan's default mixed_precision_param
    "tp2_fsdp2": Case(tp=2),
    "meta_init_fsdp4": Case(meta_init=True),
}


@contextlib.contextmanager
def titan_calls(shard):
    """torchtitan's ``apply_fsdp_to_decoder`` calls the ``fully_shard`` of its module: swap it for
    ``shard`` (counting the calls) while parallelize runs."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return shard(*args, **kwargs)

    original = titan_fsdp.fully_shard
    titan_fsdp.fully_shard = counted
    try:
        yield calls
    finally:
        titan_fsdp.fully_shard = original


def debug_model_config(parallelism: ParallelismConfig):
    spec = model_registry("debugmodel", attn_backend="flex")
    config = spec.model
    config.layers = config.layers[:LAYERS]
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
        layer.attention.rope = replace(layer.attention.rope, max_seq_len=SEQ)
    set_llama3_sharding_config(config, enable_sp=parallelism.enable_sequence_parallel)
    return spec, config


def build(case: Case, shard) -> tuple[torch.nn.Module, ParallelDims, int]:
    """torchtitan's trainer steps from the model config to a parallelized, initialised model."""
    parallelism = ParallelismConfig(
        spmd_backend="partial_dtensor", data_parallel_shard_degree=-1, tensor_parallel_degree=case.tp
    )
    titan_dist.set_spmd_backend(parallelism.spmd_backend)
    titan_parallel_dims.device_type = "cpu"
    parallel_dims = ParallelDims.from_config(parallelism, dist.get_world_size())
    parallel_dims.build_mesh()
    titan_dist.set_determinism(parallel_dims, torch.device("cpu"), DebugConfig(seed=SEED), ["pp"])
    spec, config = debug_model_config(parallelism)
    with torch.device("meta") if case.meta_init else contextlib.nullcontext():
        model = config.build()
    if not case.meta_init:
        with torch.no_grad():
            model.init_weights()
    with titan_calls(shard) as calls:
        model = spec.parallelize_fn(
            model,
            parallel_dims=parallel_dims,
            training=TrainingConfig(mixed_precision_param=case.param_dtype),
            parallelism=parallelism,
            compile_config=CompileConfig(),
            ac_config=None,
            dump_folder=".",
        )
    if shard is torch_fully_shard and dist.get_backend() == "gloo":
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    if case.meta_init:
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights()
    model.train()
    return model, parallel_dims, len(calls)


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach().clone()


def train(case: Case, shard) -> dict:
    """STEPS steps of torchtitan's train_step (no accumulation, no PP) on seeded random tokens."""
    model, parallel_dims, n_calls = build(case, shard)
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
    batch_mesh = parallel_dims.get_mesh("batch")
    rows = BATCH // batch_mesh.size()
    first = batch_mesh.get_local_rank() * rows
    generator = torch.Generator().manual_seed(1234)
    vocab = model.tok_embeddings.num_embeddings
    losses, grad_norms, grads = [], [], []
    for _ in range(STEPS):
        tokens = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=generator)
        local = tokens[first : first + rows]
        global_valid_tokens = torch.tensor(BATCH * SEQ, dtype=torch.int64)
        loss, _ = loss_fn(model(local[:, :-1]), local[:, 1:], global_valid_tokens)
        loss.backward()
        grads.append({name: full(p.grad) for name, p in model.named_parameters() if p.grad is not None})
        grad_norm = titan_dist.clip_grad_norm_(list(model.parameters()), MAX_NORM, foreach=True)
        optimizer.step()
        optimizer.zero_grad()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss, group=batch_mesh.get_group())  # torchtitan's global_avg_loss
        losses.append(float(global_loss))
        grad_norms.append(float(full(grad_norm)))
    return {
        "losses": losses,
        "grad_norms": grad_norms,
        "is_fsdp_module": isinstance(model, FSDPModule),
        "fully_shard_calls": n_calls,
        "grads": grads,
        "params": {name: full(p) for name, p in model.named_parameters()},
    }


def max_diff(a: dict, b: dict) -> float:
    """Largest |a - b| over the named tensors; inf when the names or shapes differ."""
    if set(a) != set(b) or any(a[n].shape != b[n].shape for n in a):
        return float("inf")
    return max((a[n].float() - b[n].float()).abs().max().item() for n in a)


def run_case(case: Case) -> dict:
    arms = {"torch": train(case, torch_fully_shard), "ours": train(case, our_fully_shard)}
    result = {name: {k: v for k, v in arm.items() if k not in ("grads", "params")} for name, arm in arms.items()}
    ours, theirs = arms["ours"], arms["torch"]
    result["diff"] = {
        "grads": [max_diff(a, b) for a, b in zip(ours["grads"], theirs["grads"])],
        "params": max_diff(ours["params"], theirs["params"]),
        "grad_names_equal": [sorted(a) == sorted(b) for a, b in zip(ours["grads"], theirs["grads"])],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="all")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    cases = {name: (lambda case=case: run_case(case)) for name, case in CASES.items()}
    run_cases(cases, args.cases, Path(args.out) / f"torchtitan_rank{dist.get_rank()}.json")


if __name__ == "__main__":
    main()
