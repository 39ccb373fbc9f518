"""What every drop-in case shares, on the worker side: torch's own test ``Transformer`` (``common_dtensor``)
and its token batches, the training loop of torch's FSDP2 tests (per-block fully_shard + root, AdamW,
``STEPS`` steps), and ``run_three``, which trains one model three times side by side -- one process on the
global batch (the single-process reference), torch's ``torch.distributed.fsdp.fully_shard``, and
``hyper_parallel.fully_shard`` -- and records the largest absolute difference of ours against torch and
against the reference for the losses, every gradient and every parameter (``full_tensor()``); the cases
live in ``drop_in_*_cases.py``, the launch in ``drop_in_worker.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

from hyper_parallel.fsdp import fully_shard as our_fully_shard
from hyper_parallel.mesh_dims import MeshDim

STEPS = 3
BATCH, SEQ = 8, 16  # global batch of token rows; every data-parallel rank takes BATCH / dp rows
ARGS = ModelArgs(n_layers=2, vocab_size=32, max_seq_len=SEQ, dim=32, n_heads=4, dropout_p=0.0)
CASES: dict[str, Callable] = {}
"""case name -> function returning its JSON-serialisable result; filled by the case modules on import."""


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
    model: nn.Module,
    batch: torch.Tensor,
    *,
    clip: float | None = None,
    frozen: Callable[[int], None] | None = None,
    loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor] = lm_loss,
) -> dict:
    """STEPS AdamW steps of ``loss_fn``; losses averaged over the ranks (the global-batch mean), grads and
    params in full."""
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for step in range(STEPS):
        if frozen is not None:
            frozen(step)
        loss = loss_fn(model, batch)
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
    if "ref" in runs:  # the size of the gradients, for bounds relative to it (a bf16 compute path)
        result["ref"]["grad_scale"] = max(
            (t.float().abs().max().item() for grads in runs["ref"]["grads"] for t in grads.values() if t.numel()),
            default=0.0,
        )
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
    return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=(MeshDim.FSDP,))


SHARDERS: dict[str, Callable] = {"torch": torch_fully_shard, "ours": our_fully_shard}


def as_list(value) -> list[torch.Tensor]:
    """A recorded quantity (a tensor, a DTensor or a list of them) as full tensors."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [full(v).detach() for v in values]


def side_by_side(run: Callable[[Callable], dict]) -> dict:
    """``run(fully_shard)`` once with torch's and once with ours (each seeding its own model); per recorded
    quantity the largest |ours - torch| (inf when the shapes differ), and everything ours recorded that is not a
    tensor under ``facts`` beside what torch's run recorded under ``torch_facts``."""
    runs = {name: run(shard) for name, shard in SHARDERS.items()}
    diffs, facts = {}, {}
    for key, value in runs["ours"].items():
        if not isinstance(value, (torch.Tensor, list, tuple)) or (
            isinstance(value, (list, tuple)) and value and not isinstance(value[0], torch.Tensor)
        ):
            facts[key] = value
            continue
        ours, theirs = as_list(value), as_list(runs["torch"][key])
        if len(ours) != len(theirs) or any(a.shape != b.shape for a, b in zip(ours, theirs)):
            diffs[key] = float("inf")
        else:
            diffs[key] = max(
                (float((a.double() - b.double()).abs().max()) for a, b in zip(ours, theirs) if a.numel()), default=0.0
            )
    torch_facts = {key: value for key, value in runs["torch"].items() if key in facts}
    return {"torch": diffs, "facts": facts, "torch_facts": torch_facts}


def train_steps(model: nn.Module, inputs: list[torch.Tensor], loss_fn=lambda out: out.float().sum()) -> dict:
    """One Adam step per input; the losses (summed over ranks), the last gradients and the parameters."""
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for inp in inputs:
        loss = loss_fn(model(inp))
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        optim.step()
        optim.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total)
    return {"losses": losses, "grads": grads, "params": list(model.parameters())}


def random_inputs(shape: tuple[int, ...], dtype=torch.float32) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + dist.get_rank())
    return [torch.randn(shape, generator=generator).to(dtype) for _ in range(STEPS)]
