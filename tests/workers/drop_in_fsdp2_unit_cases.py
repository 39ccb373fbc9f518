"""Drop-in cases from torch's own FSDP2 test suite, about units and their hooks, over 4 ranks (checked by
tests/test_drop_in_fsdp2.py): every case runs once with torch's ``fully_shard`` and once with ours
(``drop_in_training.side_by_side``) and records the largest difference, plus facts a case needs.

* a unit of several modules where one feeds another: ``fully_shard([a, b])`` with ``b(a(x))`` in bf16, the
  tied ``fully_shard([tok_embeddings, output])`` over rows that do not divide evenly, and a chunked loss that
  skips the head of ``fully_shard([norm, head])`` in forward and calls it per chunk;
* activation-checkpoint recomputation repeats the mixed-precision casts of inputs and outputs;
* dataclass activations between units; ``torch.func.jvp`` through a unit;
* torch's public helpers on ours: ``register_fsdp_forward_method``, ``share_comm_ctx``;
* torchtitan's per-block ``block.compile(fullgraph=True)`` before fully_shard.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from drop_in_training import case, random_inputs, side_by_side, tokens, train_steps, transformer
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, register_fsdp_forward_method, share_comm_ctx
from torch.distributed.tensor import distribute_tensor
from torch.utils.checkpoint import checkpoint

from hyper_parallel.mesh_dims import MeshDim

BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16)


class Chain(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).float())  # fp32 between them: b casts its own input


@case
def unit_of_modules_feeding_each_other():
    """fully_shard([a, b]) where b computes on a's output (FSDP2's test_grouped_module_cast_forward_inputs)."""

    def run(shard):
        torch.manual_seed(0)
        model = Chain()
        shard([model.a, model.b], mp_policy=BF16)
        shard(model, mp_policy=BF16)
        result = train_steps(model, random_inputs((2, 16)))
        result["output_dtype"] = str(model(torch.ones(1, 16)).dtype)
        return result

    return side_by_side(run)


class Tied(nn.Module):
    def __init__(self, vocab: int, dim: int = 16) -> None:
        super().__init__()
        self.tok_embeddings, self.output = nn.Embedding(vocab, dim), nn.Linear(dim, vocab, bias=False)
        self.output.weight = self.tok_embeddings.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.output(self.tok_embeddings(ids))


@case
def tied_embedding_and_output_as_one_unit():
    """fully_shard([tok_embeddings, output]) on tied weights of 17 rows over 4 ranks (FSDP2's
    test_train_shared_params_uneven_shard): every row trained, the padded last shard too."""
    vocab = 17

    def run(shard):
        torch.manual_seed(0)
        model = Tied(vocab)
        before = model.tok_embeddings.weight.detach().clone()
        shard([model.tok_embeddings, model.output])
        shard(model)
        generator = torch.Generator().manual_seed(7 + dist.get_rank())
        ids = [torch.randint(0, vocab, (2, 8), generator=generator) for _ in range(3)]
        result = train_steps(model, ids, loss_fn=lambda logits: F.cross_entropy(logits.flatten(0, 1), ids[0].flatten()))
        after = model.tok_embeddings.weight.full_tensor()
        result["rows_trained"] = int((after != before).any(dim=1).sum())
        return result

    return side_by_side(run)


class ChunkedHead(nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 16, tie: bool = False) -> None:
        super().__init__()
        self.embed, self.body = nn.Embedding(vocab, dim), nn.Linear(dim, dim, bias=False)
        self.norm, self.head = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, skip_head: bool = False) -> torch.Tensor:
        h = self.norm(self.body(self.embed(ids)))
        return h if skip_head else self.head(h)


def _chunked_steps(model: ChunkedHead, ids: list[torch.Tensor], chunks: int = 4) -> dict:
    """torchtitan's chunked loss: forward without the head, the head called per chunk with a backward each, then
    the backward of the rest; Adam steps."""
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    head_grads = []
    for batch in ids:
        h = model(batch, skip_head=True)
        grads = []
        for chunk in torch.chunk(h.detach(), chunks, dim=1):
            chunk = chunk.contiguous().requires_grad_(True)
            model.head(chunk).float().sum().backward()
            grads.append(chunk.grad)
            head_grads.append(model.head.weight.grad.full_tensor())
        h.backward(torch.cat(grads, dim=1))
        optim.step()
        optim.zero_grad()
    return {"head_grads": head_grads, "params": list(model.parameters())}


@case
def chunked_loss_skips_the_head_of_a_unit():
    """fully_shard([norm, head]) (and, tied, [embed, norm, head]) where forward skips the head and the loss calls
    it per chunk (FSDP2's test_partial_group_forward_then_standalone): every chunk adds to the head's gradient."""

    def run(shard, tie: bool):
        torch.manual_seed(0)
        model = ChunkedHead(tie=tie)
        group = [model.embed, model.norm, model.head] if tie else [model.norm, model.head]
        if not tie:
            shard(model.embed)
        shard(model.body)
        shard(group)
        shard(model)
        generator = torch.Generator().manual_seed(3 + dist.get_rank())
        return _chunked_steps(model, [torch.randint(0, 32, (2, 16), generator=generator) for _ in range(2)])

    return {
        "separate": side_by_side(lambda shard: run(shard, False)),
        "tied": side_by_side(lambda shard: run(shard, True)),
    }


class RecordingLinear(nn.Linear):
    def __init__(self, seen: list[str]) -> None:
        super().__init__(4, 4)
        self.seen = seen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(f"in {x.dtype}")
        return super().forward(x)


class Recording(nn.Module):
    """A checkpointed unit: records the dtype its forward receives (after fully_shard's input cast) and the dtype
    the checkpointed function gets back (after its output cast), in forward and in the recomputation."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.linear, self.dtype = RecordingLinear(self.seen), dtype

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        self.seen.append(f"out {out.dtype}")
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x.to(self.dtype), use_reentrant=False, early_stop=False).float().sum()


@case
def checkpoint_recompute_repeats_the_casts():
    """Activation checkpointing recomputes a unit's forward in backward with its mixed-precision casts
    (FSDP2's test_checkpoint_recompute_casts_*): the recorded dtypes of both passes, and the gradients."""
    policies = {
        "inputs": (torch.float32, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)),
        "outputs": (
            torch.bfloat16,
            MixedPrecisionPolicy(torch.bfloat16, torch.bfloat16, output_dtype=torch.float32, cast_forward_inputs=False),
        ),
    }

    def run(shard, dtype, policy):
        torch.manual_seed(0)
        model = Recording(dtype)
        shard(model.linear, mp_policy=policy)
        shard(model, mp_policy=policy)
        result = train_steps(model, random_inputs((8, 4)), loss_fn=lambda loss: loss)
        result["seen"] = model.seen[:4]
        return result

    return {name: side_by_side(lambda shard, d=d, p=p: run(shard, d, p)) for name, (d, p) in policies.items()}


@dataclasses.dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


class ToPair(nn.Module):
    def forward(self, x: torch.Tensor) -> Pair:
        return Pair(x, x.clone())


class PairLinear(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.layer = nn.Linear(dim, dim)

    def forward(self, pair: Pair) -> Pair:
        return Pair(self.layer(pair.x), self.layer(pair.y))


class FromPair(nn.Module):
    def forward(self, pair: Pair) -> torch.Tensor:
        return pair.x + pair.y


@case
def dataclass_activations_between_units():
    """A dataclass passed between units (FSDP2's test_structured_input_output), in fp32 and in bf16."""

    def run(shard, policy):
        torch.manual_seed(0)
        model = nn.Sequential(ToPair(), PairLinear(), PairLinear(), FromPair())
        for module in model:
            shard(module, mp_policy=policy)
        shard(model, mp_policy=policy)
        return train_steps(model, random_inputs((2, 16)))

    return {
        "fp32": side_by_side(lambda shard: run(shard, MixedPrecisionPolicy())),
        "bf16": side_by_side(lambda shard: run(shard, BF16)),
    }


@case
def jvp_through_a_unit():
    """torch.func.jvp through a unit whose first all-gather happens inside the transform (FSDP2's
    test_no_warmup_jvp_reshard_after_forward_false): its output, and a zero tangent where it does not depend on
    the primal."""
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=(MeshDim.FSDP,))

    def run(shard):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        with torch.device("meta"):
            enc, dec = nn.Linear(8, 16, bias=False), nn.Linear(16, 12, bias=False)
        for module in (enc, dec):
            shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
        for seed, module in enumerate((enc, dec)):  # no DTensor random op: its offsets differ run to run
            module.to_empty(device="cpu")
            weight = torch.randn(module.weight.shape, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                module.weight.copy_(distribute_tensor(weight, module.weight.device_mesh, module.weight.placements))
        generator = torch.Generator().manual_seed(0)
        x, primal, tangent = (torch.randn(n, generator=generator, dtype=torch.bfloat16) for n in (8, 12, 12))
        e = enc(x)
        output, tangent_output = torch.func.jvp(lambda unused: dec(e), (primal,), (tangent,))
        return {"output": output, "tangent": tangent_output, "tangent_is_zero": bool((tangent_output == 0).all())}

    return side_by_side(run)


class Vision(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch_proj = nn.Conv2d(3, 16, kernel_size=4, stride=4)

    def forward_features(self, imgs: torch.Tensor) -> torch.Tensor:
        return self.patch_proj(imgs).flatten(2).transpose(1, 2)

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        return self.forward_features(imgs).sum(dim=1)


class WithProjector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.vit, self.projector = Vision(), nn.Linear(16, 8)

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        return self.projector(self.vit.forward_features(imgs))  # a method other than forward


@case
def forward_method_registered_with_torch():
    """torch's register_fsdp_forward_method(model.vit, "forward_features") (what HF generate needs) and
    share_comm_ctx over the units (what pipeline stages call), on ours as on FSDP2."""

    def run(shard):
        torch.manual_seed(0)
        model = WithProjector()
        shard(model.vit)
        shard(model.projector)
        shard(model)
        register_fsdp_forward_method(model.vit, "forward_features")
        share_comm_ctx([model.vit, model.projector])
        return train_steps(model, random_inputs((2, 3, 8, 8)))

    return side_by_side(run)


@case
def blocks_compiled_with_fullgraph():
    """torchtitan's apply_compile: every block.compile(backend, fullgraph=True), then fully_shard per block and
    on the root (aot_eager: dynamo's full graph without inductor's build); the blocks' graphs counted."""

    def run(shard):
        graphs = []

        def backend(graph_module, example_inputs):
            graphs.append(len(graph_module.graph.nodes))
            return torch._dynamo.backends.debugging.aot_eager(graph_module, example_inputs)

        torch._dynamo.reset()
        model = transformer(weight_tying=False)
        for layer in model.layers:
            layer.compile(backend=backend, fullgraph=True)
            shard(layer)
        shard(model)
        _, local = tokens(dist.get_rank(), 4)
        result = train_steps(model, [local[:, :-1]] * 2)
        result["graph_nodes"] = graphs
        return result

    return side_by_side(run)
