"""torchrun worker for tests/test_drop_in.py: our fully_shard as a drop-in for torch FSDP2 on models we did not write.

Every case builds one model (torch's test ``Transformer`` from ``common_dtensor``, or ``common_fsdp.MLP``),
deep-copies it three times and trains the copies side by side for ``STEPS`` AdamW steps on the same data:

* ``ref``: one process, the global batch (the single-process reference);
* ``torch``: the training loop of torch's FSDP2 tests, per-block ``torch.distributed.fsdp.fully_shard`` + root;
* ``ours``: the same loop with ``hyper_parallel.fully_shard`` swapped in.

Per rank it records, per step, the loss, every gradient and every parameter (``full_tensor()``) of each
copy, and the largest absolute difference of ours against torch and against ref. Cases that need data
beyond numbers (the traced reduce-scatter bytes) record them under ``facts``. A case that raises records
its traceback; the ranks meet at a barrier before the next case.

    torchrun --nproc-per-node 4 tests/workers/drop_in_cases.py --out DIR [--cases a,b]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module
from torch.testing._internal.common_fsdp import MLP
from torch.testing._internal.distributed._tensor.common_dtensor import ExpertParallel, ModelArgs, Transformer

from hyper_parallel import trace
from hyper_parallel.fsdp import fully_shard as our_fully_shard

STEPS = 3
BATCH, SEQ = 8, 16  # global batch of token rows; every data-parallel rank takes BATCH / dp rows
ARGS = ModelArgs(n_layers=2, vocab_size=32, max_seq_len=SEQ, dim=32, n_heads=4, dropout_p=0.0)
CASES: dict[str, Callable] = {}


def case(fn: Callable) -> Callable:
    CASES[fn.__name__] = fn
    return fn


# --------------------------------------------------------------------------- shared loop


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach().clone()


def transformer(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelArgs(**{**ARGS.__dict__, **overrides}))


def tokens(dp_rank: int, dp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch (same on every rank) and this data-parallel rank's rows of it."""
    generator = torch.Generator().manual_seed(1234)
    batch = torch.randint(0, ARGS.vocab_size, (BATCH, SEQ + 1), generator=generator)
    rows = BATCH // dp_size
    return batch, batch[dp_rank * rows : (dp_rank + 1) * rows]


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def shard_per_block(model: Transformer, shard: Callable, mesh: DeviceMesh, **kwargs) -> None:
    """The loop of torch's FSDP2 tests: every block, then the root."""
    for layer in model.layers:
        shard(layer, mesh=mesh, **kwargs)
    shard(model, mesh=mesh, **kwargs)


def train(
    model: nn.Module, batch: torch.Tensor, *, clip: float | None = None, frozen: Callable[[int], None] | None = None
) -> dict:
    """STEPS AdamW steps; losses averaged over the ranks (the global-batch mean), grads and params in full."""
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for step in range(STEPS):
        if frozen is not None:
            frozen(step)
        loss = lm_loss(model, batch)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
        grads.append({n: full(p.grad) for n, p in model.named_parameters() if p.grad is not None})
        optim.step()
        optim.zero_grad()
        losses.append(loss.detach().clone())
    return {"losses": losses, "grads": grads, "params": {n: full(p) for n, p in model.named_parameters()}}


def global_losses(losses: list[torch.Tensor], distributed: bool) -> list[float]:
    if not distributed:
        return [float(x) for x in losses]
    result = []
    for loss in losses:
        value = loss.clone()
        dist.all_reduce(value)
        result.append(float(value) / dist.get_world_size())
    return result


def max_diff(a: dict, b: dict) -> float:
    """Largest |a - b| over the tensors both have; inf when their names or shapes differ."""
    if set(a) != set(b):
        return float("inf")
    worst = 0.0
    for name in a:
        if a[name].shape != b[name].shape:
            return float("inf")
        worst = max(worst, (a[name].float() - b[name].float()).abs().max().item() if a[name].numel() else 0.0)
    return worst


def compare(runs: dict[str, dict], dp_size: int) -> dict:
    """Differences of ours against torch FSDP2 and against the reference, per quantity."""
    result = {}
    for other in ("torch", "ref"):
        if other not in runs:
            continue
        ours, theirs = runs["ours"], runs[other]
        result[other] = {
            "loss": max(abs(a - b) for a, b in zip(ours["global_losses"], theirs["global_losses"])),
            "grads": max(max_diff(a, b) for a, b in zip(ours["grads"], theirs["grads"])),
            "params": max_diff(ours["params"], theirs["params"]),
        }
    result["losses"] = {name: run["global_losses"] for name, run in runs.items()}
    result["param_names"] = {name: sorted(run["params"]) for name, run in runs.items()}
    return result


def run_three(
    build: Callable[[], nn.Module],
    parallelize: dict[str, Callable[[nn.Module], nn.Module]],
    dp_rank: int,
    dp_size: int,
    with_ref: bool = True,
    **train_kwargs,
) -> dict:
    """Train ref (global batch) and each parallel copy (its rows); compare."""
    batch, local = tokens(dp_rank, dp_size)
    runs = {}
    if with_ref:
        runs["ref"] = train(build(), batch, **train_kwargs)
        runs["ref"]["global_losses"] = global_losses(runs["ref"]["losses"], distributed=False)
    for name, apply in parallelize.items():
        model = apply(build())
        runs[name] = train(model, local, **train_kwargs)
        runs[name]["global_losses"] = global_losses(runs[name]["losses"], distributed=True)
    return compare(runs, dp_size)


def fsdp_only(mesh: DeviceMesh, **kwargs) -> dict[str, Callable]:
    def with_(shard):
        def apply(model):
            shard_per_block(model, shard, mesh, **kwargs)
            return model

        return apply

    return {"torch": with_(torch_fully_shard), "ours": with_(our_fully_shard)}


def world_mesh() -> DeviceMesh:
    return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))


# --------------------------------------------------------------------------- cases


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


def tp_case(shape: tuple[int, int, int], sequence_parallel: bool, tying: bool) -> dict:
    """TP on mesh["tp"] with torch's own plan, fully_shard on mesh["dp_replicate", "fsdp"]: slices of ONE mesh."""
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp_replicate", "fsdp", "tp"))
    dp_mesh = mesh["dp_replicate", "fsdp"]
    dp_size = shape[0] * shape[1]
    dp_rank = dp_mesh.get_coordinate()[0] * shape[1] + dp_mesh.get_coordinate()[1]

    def with_(shard):
        def apply(model):
            # local_output_for_attn: DTensor has no sharding rule for CPU's fused attention kernel
            Transformer.parallelize(model, mesh["tp"], use_seq_parallel=sequence_parallel, local_output_for_attn=True)
            shard_per_block(model, shard, dp_mesh)
            return model

        return apply

    return run_three(
        lambda: transformer(weight_tying=tying),
        {"torch": with_(torch_fully_shard), "ours": with_(our_fully_shard)},
        dp_rank,
        dp_size,
    )


@case
def mesh_2_1_2_tp():
    return tp_case((2, 1, 2), sequence_parallel=False, tying=False)


@case
def mesh_1_2_2_tied_tp_sp():
    return tp_case((1, 2, 2), sequence_parallel=True, tying=True)


@case
def frozen_hsdp():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "fsdp"))
    return frozen_run(mesh, dist.get_rank(), 4)


@case
def activation_checkpointing():
    return run_three(
        lambda: transformer(weight_tying=False, checkpoint_activations=True),
        fsdp_only(world_mesh()),
        dist.get_rank(),
        4,
    )


@case
def keep_after_forward():
    return run_three(
        lambda: transformer(weight_tying=False),
        fsdp_only(world_mesh(), reshard_after_forward=False),
        dist.get_rank(),
        4,
    )


@case
def reshard_to_two_after_forward():
    """reshard_after_forward=2 on fsdp 4: backward all-gathers over 2 ranks, from the kept half."""
    result = run_three(
        lambda: transformer(weight_tying=False), fsdp_only(world_mesh(), reshard_after_forward=2), dist.get_rank(), 4
    )
    model = transformer(weight_tying=False)
    shard_per_block(model, our_fully_shard, world_mesh(), reshard_after_forward=2)
    _, local = tokens(dist.get_rank(), 4)
    with trace.record() as recorder:
        lm_loss(model, local).backward()
    result["facts"] = {
        "all_gathers": sorted(
            (e["phase"], e["module"], e["ranks"], e["bytes"])
            for e in recorder.events
            if e["kind"] == "collective" and e["op"] == "all_gather"
        )
    }
    return result


@case
def modules_as_one_unit():
    """fully_shard([norm, output]) as one unit (chunked-loss style), then the blocks and the root."""

    def with_(shard):
        def apply(model):
            shard([model.norm, model.output], mesh=world_mesh())
            shard_per_block(model, shard, world_mesh())
            return model

        return apply

    return run_three(
        lambda: transformer(weight_tying=False),
        {"torch": with_(torch_fully_shard), "ours": with_(our_fully_shard)},
        dist.get_rank(),
        4,
    )


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


@case
def common_fsdp_mlp():
    def build():
        torch.manual_seed(0)
        return nn.Sequential(MLP(16), MLP(16, dim_multiplier=3), nn.Linear(16, 32))

    def with_(shard):
        def apply(model):
            for sub in model[:2]:
                shard(sub, mesh=world_mesh())
            shard(model, mesh=world_mesh())
            return model

        return apply

    original = lm_loss
    globals()["lm_loss"] = lambda model, batch: F.cross_entropy(
        model(F.one_hot(batch[:, :-1] % 16, 16).float()).flatten(0, 1), batch[:, 1:].flatten()
    )
    try:
        return run_three(build, {"torch": with_(torch_fully_shard), "ours": with_(our_fully_shard)}, dist.get_rank(), 4)
    finally:
        globals()["lm_loss"] = original


@case
def moe_expert_parallel():
    """torch's test MoE: ExpertParallel on ep=2 (tokens all-gathered in, outputs reduce-scattered back), the
    experts a unit on efsdp=2 of the same 4 ranks, dense parts on fsdp=4. Each rank's expert gradient sums
    the tokens of its ep group, and the efsdp reduction those of the other group: 4 ranks' worth, so the
    experts divide by 4 (set_gradient_divide_factor), not by efsdp's 2. No FSDP2 oracle: its divide
    factor needs PREMUL_SUM, which gloo lacks."""
    sparse = init_device_mesh("cpu", (2, 2), mesh_dim_names=("efsdp", "ep"))

    def apply(model):
        for layer in model.layers:
            experts = layer.expert_layer.experts
            parallelize_module(experts, sparse["ep"], ExpertParallel())
            our_fully_shard(experts, mesh=sparse["efsdp"])
            experts.set_gradient_divide_factor(dist.get_world_size())
        shard_per_block(model, our_fully_shard, world_mesh())
        return model

    result = run_three(lambda: transformer(weight_tying=False, num_experts=4), {"ours": apply}, dist.get_rank(), 4)
    model = apply(transformer(weight_tying=False, num_experts=4))
    result["facts"] = {"expert_placements": [str(p) for p in model.layers[0].expert_layer.experts.w1.placements]}
    return result


def dcp_roundtrip(
    save_with: Callable, load_with: Callable, save_mesh: DeviceMesh, load_mesh: DeviceMesh, directory: Path
) -> dict:
    """Train 1 step with one implementation, save with DCP, load into the other on another mesh."""
    _, local = tokens(dist.get_rank(), 4)
    source = transformer(weight_tying=False)
    shard_per_block(source, save_with, save_mesh)
    train(source, local)
    expected = {n: full(p) for n, p in source.named_parameters()}
    if dist.get_rank() == 0:
        shutil.rmtree(directory, ignore_errors=True)
    dist.barrier()
    dcp.save(source.state_dict(), checkpoint_id=str(directory))
    target = transformer(weight_tying=False)
    shard_per_block(target, load_with, load_mesh)
    state = target.state_dict()
    dcp.load(state, checkpoint_id=str(directory))
    target.load_state_dict(state)
    loaded = {n: full(p) for n, p in target.named_parameters()}
    return {"max_abs": max_diff(loaded, expected)}


@case
def dcp_ours_to_torch_and_back():
    directory = Path(os.environ.get("DROP_IN_OUT", ".")) / "dcp"
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "fsdp"))
    return {
        "ours_to_torch": dcp_roundtrip(our_fully_shard, torch_fully_shard, world_mesh(), hsdp, directory),
        "torch_to_ours": dcp_roundtrip(torch_fully_shard, our_fully_shard, hsdp, world_mesh(), directory),
    }


# --------------------------------------------------------------------------- driver


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="all")
    args = parser.parse_args()
    os.environ["DROP_IN_OUT"] = args.out
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    names = list(CASES) if args.cases == "all" else args.cases.split(",")
    results = {}
    for name in names:
        try:
            results[name] = CASES[name]()
        except Exception:  # recorded: the test reports the traceback of the failing case
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    out = Path(args.out) / f"drop_in_rank{dist.get_rank()}.json"
    out.write_text(json.dumps(results, indent=1, default=str))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
