"""Drop-in cases about parameters that need more than sharding, on torch's test Transformer over 4 ranks:
plain, tied embeddings (one parameter after fully_shard), frozen parameters (LoRA style, also under HSDP,
and unfrozen between steps), ignored parameters, gradient clipping and evaluation under no_grad; each
trained by ours, by torch FSDP2 and by one process on the global batch (checked by tests/test_drop_in.py:
bit-equal to torch FSDP2, close to the single-process reference, and the reduce-scatter bytes of the
frozen case against counts derived by hand).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from drop_in_training import (
    case,
    compare,
    fsdp_only,
    global_losses,
    lm_loss,
    run_three,
    shard_per_block,
    tokens,
    train,
    transformer,
    world_mesh,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.tensor import DTensor

from hyper_parallel import trace
from hyper_parallel.fsdp import fully_shard as our_fully_shard
from hyper_parallel.mesh_dims import MeshDim


@case
def plain():
    return run_three(lambda: transformer(weight_tying=False), fsdp_only(world_mesh()), dist.get_rank(), 4)


@case
def tied():
    """GPT-2 / Llama-3.2 style: output.weight is tok_embeddings.weight, both in the root unit."""
    result = run_three(lambda: transformer(weight_tying=True), fsdp_only(world_mesh()), dist.get_rank(), 4)
    model = transformer(weight_tying=True)
    shard_per_block(model, our_fully_shard, world_mesh())
    result["facts"] = {
        "same_object": model.output.weight is model.tok_embeddings.weight,
        "n_parameters": len(list(model.parameters())),
        "n_reference_parameters": len(list(transformer(weight_tying=True).parameters())),
    }
    return result


FROZEN = ("attention_norm", "ffn_norm", "pos_embeddings", "attention.wq", "norm")


def freeze(model: nn.Module, names=FROZEN) -> None:
    for name, param in model.named_parameters():
        if any(name.startswith(f"{f}.") or f".{f}." in name for f in names):
            param.requires_grad_(False)


def frozen_run(mesh: DeviceMesh, dp_rank: int, dp_size: int) -> dict:
    def build():
        model = transformer(weight_tying=False)
        freeze(model)
        return model

    return run_three(build, fsdp_only(mesh), dp_rank, dp_size)


@case
def frozen():
    """LoRA/PEFT style: norms, the position embedding and wq frozen in every unit."""
    result = frozen_run(world_mesh(), dist.get_rank(), 4)
    model = transformer(weight_tying=False)
    freeze(model)
    shard_per_block(model, our_fully_shard, world_mesh())
    _, local = tokens(dist.get_rank(), 4)
    with trace.record() as recorder:
        lm_loss(model, local).backward()
    reference = transformer(weight_tying=False)
    freeze(reference)
    result["facts"] = {
        "reduce_scatter": {
            e["module"]: e["bytes"]
            for e in recorder.events
            if e["kind"] == "collective" and e["op"] == "reduce_scatter"
        },
        "trainable_numel": {
            f"layers.{i}": sum(p.numel() for p in layer.parameters() if p.requires_grad)
            for i, layer in enumerate(reference.layers)
        },
        "root_trainable_numel": sum(
            p.numel() for n, p in reference.named_parameters() if p.requires_grad and not n.startswith("layers.")
        ),
    }
    return result


@case
def freeze_between_steps():
    """Unfreeze wq after step 1 (requires_grad set on the sharded parameters, as a user does)."""

    def frozen_until_1(model):
        def hook(step):
            for name, param in model.named_parameters():
                if ".attention.wq." in name:
                    param.requires_grad_(step >= 1)

        return hook

    batch, local = tokens(dist.get_rank(), 4)
    runs = {}
    for name, apply in {"ref": lambda m: m, **fsdp_only(world_mesh())}.items():
        model = apply(transformer(weight_tying=False))
        runs[name] = train(model, batch if name == "ref" else local, frozen=frozen_until_1(model))
        runs[name]["global_losses"] = global_losses(runs[name]["losses"], distributed=name != "ref")
    return compare(runs, 4)


@case
def frozen_hsdp():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=(MeshDim.DP_REPLICATE, MeshDim.FSDP))
    return frozen_run(mesh, dist.get_rank(), 4)


@case
def ignored_params():
    """pos_embeddings ignored: not sharded, its gradient not reduced (each rank keeps its own)."""

    def with_(shard):
        def apply(model):
            shard_per_block(model, shard, world_mesh(), ignored_params={model.pos_embeddings.weight})
            return model

        return apply

    result = run_three(
        lambda: transformer(weight_tying=False),
        {"torch": with_(torch_fully_shard), "ours": with_(our_fully_shard)},
        dist.get_rank(),
        4,
        with_ref=False,
    )
    model = with_(our_fully_shard)(transformer(weight_tying=False))
    result["facts"] = {"ignored_is_dtensor": isinstance(model.pos_embeddings.weight, DTensor)}
    return result


@case
def clip_grad_norm():
    return run_three(lambda: transformer(weight_tying=True), fsdp_only(world_mesh()), dist.get_rank(), 4, clip=0.5)


@case
def eval_no_grad():
    _, local = tokens(dist.get_rank(), 4)
    outputs = {}
    for name, apply in fsdp_only(world_mesh()).items():
        model = apply(transformer(weight_tying=True))
        train(model, local)
        model.eval()
        with torch.no_grad():
            outputs[name] = model(local[:, :-1])
    return {"torch": {"logits": (outputs["ours"] - outputs["torch"]).abs().max().item()}}
