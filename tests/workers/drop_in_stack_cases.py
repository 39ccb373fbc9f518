"""Drop-in cases from other people's training stacks, over 4 ranks (checked by tests/test_drop_in_stacks.py):

* torchtitan / torchtune build large models on the meta device: ``fully_shard`` on meta parameters, then
  ``to_empty`` + ``reset_parameters`` (equal to torch FSDP2 doing the same), or a full state dict broadcast
  from rank 0 with ``set_model_state_dict`` (equal to the single-process run on the same weights);
* a Switch-style MoE whose router sends no token of some rank to some expert: every rank still gets the
  expert's reduced gradient (against the single process and FSDP2 with ``set_reduce_scatter_unused_params``);
* QLoRA: a frozen bf16 base and trainable fp32 adapters in one unit;
* gradient accumulation over 4 micro-batches under ``MixedPrecisionPolicy(bf16, reduce fp32)``: the parked
  sum is kept in fp32, as FSDP2 keeps it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from drop_in_training import (
    ARGS,
    case,
    compare,
    full,
    global_losses,
    lm_loss,
    run_three,
    shard_per_block,
    tokens,
    train,
    transformer,
    world_mesh,
)
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy as TorchMixedPrecision
from torch.distributed.fsdp import fully_shard as torch_fully_shard

from hyper_parallel.fsdp import MixedPrecisionPolicy as OurMixedPrecision
from hyper_parallel.fsdp import fully_shard as our_fully_shard

SHARDERS = {"torch": torch_fully_shard, "ours": our_fully_shard}


def _meta_transformer() -> nn.Module:
    with torch.device("meta"):
        return transformer(weight_tying=False)


@case
def meta_init_reset_parameters():
    """Meta model -> fully_shard per block + root -> to_empty(cpu) -> reset_parameters() of every module (on the
    sharded DTensors, seeded alike) -> 3 AdamW steps. Before the change: 'Cannot copy out of meta tensor'."""

    def with_(shard):
        def apply(_model):
            model = _meta_transformer()
            shard_per_block(model, shard, world_mesh())
            model.to_empty(device="cpu")
            torch.manual_seed(7)
            with torch.no_grad():
                for module in model.modules():
                    if hasattr(module, "reset_parameters"):
                        module.reset_parameters()
            return model

        return apply

    result = run_three(
        _meta_transformer, {name: with_(shard) for name, shard in SHARDERS.items()}, dist.get_rank(), 4, with_ref=False
    )
    model = with_(our_fully_shard)(None)
    result["facts"] = {"param_abs_sum": sum(full(p).abs().sum().item() for p in model.parameters())}
    return result


@case
def meta_init_state_dict_broadcast():
    """torchtune's loading: rank 0 holds the full state dict; every rank builds the model on meta, shards it and
    calls set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True); then 3 AdamW steps."""

    def with_(shard):
        def apply(model):
            full_sd = model.state_dict() if dist.get_rank() == 0 else {}
            sharded = _meta_transformer()
            shard_per_block(sharded, shard, world_mesh())
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(sharded, full_sd, options=options)
            return sharded

        return apply

    return run_three(
        lambda: transformer(weight_tying=False),
        {name: with_(shard) for name, shard in SHARDERS.items()},
        dist.get_rank(),
        4,
    )


class SwitchMoE(nn.Module):
    """Top-1 routing over ``experts``; an expert that gets no token is not called (as HF's MoE layers)."""

    def __init__(self, dim: int, n_experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights = F.softmax(self.router(flat), dim=-1)
        top, choice = weights.max(dim=-1)
        out = torch.zeros_like(flat)
        for index, expert in enumerate(self.experts):
            rows = (choice == index).nonzero().flatten()
            if rows.numel():
                out = out.index_add(0, rows, expert(flat[rows]) * top[rows, None])
        return x + out.reshape(x.shape)


class TokenModel(nn.Module):
    """Embedding, ``n_layers`` blocks made by ``block()``, output head: torch's Transformer with other blocks."""

    def __init__(self, block, n_layers: int = 2) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(ARGS.vocab_size, ARGS.dim)
        self.layers = nn.ModuleList(block() for _ in range(n_layers))
        self.output = nn.Linear(ARGS.dim, ARGS.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(h)


N_EXPERTS = 8


def _moe() -> TokenModel:
    torch.manual_seed(0)
    return TokenModel(lambda: SwitchMoE(ARGS.dim, N_EXPERTS))


@case
def experts_unused_on_some_ranks():
    """8 experts, 32 tokens per rank: some rank routes no token to an expert another rank uses."""

    def with_(shard, unused_flag: bool):
        def apply(model):
            shard_per_block(model, shard, world_mesh())
            model.set_reduce_scatter_unused_params(unused_flag)
            return model

        return apply

    result = run_three(
        _moe,
        {"torch": with_(torch_fully_shard, True), "ours": with_(our_fully_shard, True)},
        dist.get_rank(),
        4,
    )
    model = _moe()
    _, local = tokens(dist.get_rank(), 4)
    with torch.no_grad():
        h = model.tok_embeddings(local[:, :-1]).reshape(-1, ARGS.dim)
        choice = model.layers[0].router(h).argmax(dim=-1)
        counts = torch.bincount(choice, minlength=N_EXPERTS)
    every = [torch.zeros_like(counts) for _ in range(dist.get_world_size())]
    dist.all_gather(every, counts)
    result["facts"] = {"tokens_per_expert_layer0": [c.tolist() for c in every]}
    return result


class LoRALinear(nn.Module):
    """A frozen bf16 base (a quantised base in QLoRA) and trainable fp32 low-rank adapters."""

    def __init__(self, dim: int, rank: int = 4) -> None:
        super().__init__()
        self.base = nn.Linear(dim, dim).to(torch.bfloat16).requires_grad_(False)
        self.lora_a = nn.Linear(dim, rank, bias=False)
        self.lora_b = nn.Linear(rank, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.base(x.to(torch.bfloat16)).to(x.dtype) + self.lora_b(self.lora_a(x))


@case
def frozen_bf16_beside_trainable_fp32():
    """Each LoRA block is one unit holding bf16 (frozen) and fp32 (trainable) parameters. Before the change:
    'must share a dtype'."""

    def build() -> TokenModel:
        torch.manual_seed(0)
        return TokenModel(lambda: LoRALinear(ARGS.dim))

    def with_(shard):
        def apply(model):
            shard_per_block(model, shard, world_mesh())
            return model

        return apply

    result = run_three(build, {name: with_(shard) for name, shard in SHARDERS.items()}, dist.get_rank(), 4)
    model = with_(our_fully_shard)(build())
    result["facts"] = {
        "dtypes": sorted({str(p.dtype) for p in model.layers[0].parameters()}),
        "frozen_unchanged": _frozen_unchanged(build),
    }
    return result


def _frozen_unchanged(build) -> bool:
    """The frozen base is gathered for compute but never reduced or stepped: bit-identical after training."""
    before = {n: p.detach().clone() for n, p in build().named_parameters() if not p.requires_grad}
    model = build()
    shard_per_block(model, our_fully_shard, world_mesh())
    _, local = tokens(dist.get_rank(), 4)
    train(model, local)
    after = {n: full(p) for n, p in model.named_parameters() if not p.requires_grad}
    return set(before) == set(after) and all(torch.equal(before[n], after[n]) for n in before)


MICRO_BATCHES = 4


def _accumulate(model: nn.Module, batch: torch.Tensor) -> dict:
    """One optimizer step over MICRO_BATCHES micro-batches (rows of this rank's batch), sync on the last only."""
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pieces = batch.chunk(MICRO_BATCHES)
    losses = []
    for index, piece in enumerate(pieces):
        model.set_requires_gradient_sync(index == len(pieces) - 1)
        loss = lm_loss(model, piece) / len(pieces)
        loss.backward()
        losses.append(loss.detach().float())
    grads = {n: full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    optim.step()
    return {"losses": [sum(losses)], "grads": [grads], "params": {n: full(p) for n, p in model.named_parameters()}}


@case
def accumulation_in_reduce_dtype():
    """MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): 4 micro-batches, sync off for the first 3.
    Before the change the parked gradients were summed in bf16 (grads rel 4.4e-3 off FSDP2's)."""
    _, local = tokens(dist.get_rank(), 4)
    local = local.repeat(2, 1)  # 4 rows per rank: one row per micro-batch
    policies = {
        "torch": TorchMixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        "ours": OurMixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    }
    runs = {}
    for name, shard in SHARDERS.items():
        model = transformer(weight_tying=False)
        shard_per_block(model, shard, world_mesh(), mp_policy=policies[name])
        runs[name] = _accumulate(model, local)
        runs[name]["global_losses"] = global_losses(runs[name]["losses"], distributed=True)
    return compare(runs, 4)


class WithSpare(nn.Module):
    """A block holding a parameter its forward never uses (an expert no rank routes a token to)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(ARGS.dim, ARGS.dim)
        self.spare = nn.Linear(ARGS.dim, ARGS.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.used(x)


@case
def parameter_no_rank_uses():
    """A parameter no rank used: by default ``None``, as one process leaves it; with
    set_reduce_scatter_unused_params(True) zeros, as torch FSDP2 with the same setting."""
    grads = {}
    for name, shard, flag in (("default", our_fully_shard, False), ("ours", our_fully_shard, True)) + (
        ("torch", torch_fully_shard, True),
    ):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Embedding(ARGS.vocab_size, ARGS.dim), WithSpare(), nn.Linear(ARGS.dim, ARGS.vocab_size)
        )
        shard(model[1], mesh=world_mesh())
        shard(model, mesh=world_mesh())
        if flag:
            model.set_reduce_scatter_unused_params(True)
        _, local = tokens(dist.get_rank(), 4)
        lm_loss(model, local).backward()
        spare = model[1].spare.weight.grad
        grads[name] = None if spare is None else full(spare)
    return {
        "default_is_none": grads["default"] is None,
        "reduced_is_zero": grads["ours"] is not None and bool((grads["ours"] == 0).all()),
        "equal_to_torch": grads["torch"] is not None and torch.equal(grads["ours"], grads["torch"]),
    }
