"""Tensor (+ sequence) parallelism for the mini transformer on ``torch.distributed.tensor.parallel``.

The plan of TorchTitan's llama and PyTorch's TP tutorial: attention wq/wk/wv and feed-forward w1
colwise, wo and w2 rowwise; embeddings rowwise and the output head colwise. ``PrepareModuleInput`` on
``attention`` and ``feed_forward`` hands each block input to its colwise layers as one DTensor, so in
backward their partial input gradients are summed locally and reduced once per block input (Megatron's
f operator): without SP one all-reduce, with SP one reduce-scatter. Without that, each colwise layer
would turn the plain tensor into a DTensor of its own and all-reduce its own input gradient (wq, wk,
wv, w1: 4 per layer instead of 2).

With sequence parallelism the residual stream between blocks is sharded along the sequence (dim 1)
over tp: norms run ``SequenceParallel``, each block's input is all-gathered by ``PrepareModuleInput``,
each block's output reduce-scattered by the rowwise layer. An all-reduce is a reduce-scatter plus an
all-gather, so TP and TP+SP put the same bytes on the wire; SP saves activation memory (norms and
residuals hold 1/tp of the sequence). Norm weights then get ``Partial`` gradients over tp, which
fully_shard sums over the tp group.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hyper_parallel.models.transformer import FeedForward, Transformer, TransformerBlock


def check_heads(n_heads: int, tp: int) -> None:
    """Each tp rank computes whole heads."""
    if n_heads % tp:
        raise ValueError(f"n_heads={n_heads} must be divisible by tp={tp}")


def parallelize_root(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """The embeddings rowwise (vocabulary rows), the head colwise, the final norm on sequence shards with SP:
    the output of the embedding is reduce-scattered (SP) or all-reduced, the head's input all-gathered."""
    seq = Shard(1) if sequence_parallel else Replicate()
    root_plan: dict[str, object] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "output": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
    }
    if sequence_parallel:
        root_plan["norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, root_plan)


def parallelize_transformer_tp(
    model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool, moe_tokens_replicated: bool = False
) -> Transformer:
    """Apply TP (and SP) in place: the root, then every block (``parallelize_dense_block``); a MoE block's
    feed-forward is left to expert parallelism (``parallelize_moe_block``)."""
    if tp_mesh.size() == 1:
        return model
    check_heads(model.config.n_heads, tp_mesh.size())
    parallelize_root(model, tp_mesh, sequence_parallel)
    for layer in model.layers:
        if isinstance(layer.feed_forward, FeedForward):
            parallelize_dense_block(layer, tp_mesh, sequence_parallel)
        else:
            parallelize_moe_block(layer, tp_mesh, sequence_parallel, moe_tokens_replicated)
    return model


def attention_plan(sequence_parallel: bool) -> dict[str, object]:
    """Attention's heads split over tp (wq, wk, wv colwise, wo rowwise), its input gathered once by
    ``PrepareModuleInput``; with SP the two norms run on sequence shards."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq),
        "attention": PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None)),
    }
    if sequence_parallel:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    return plan


def parallelize_dense_block(layer: TransformerBlock, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """One dense block: attention as ``attention_plan``, the feed-forward's w1 colwise and w2 rowwise,
    its input gathered once. Without SP each rowwise output is all-reduced; with SP reduce-scattered
    along the sequence (``Shard(1)``), and each block input all-gathered."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan = attention_plan(sequence_parallel) | {
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
    }
    parallelize_module(layer, tp_mesh, plan)


def parallelize_moe_block(
    layer: TransformerBlock, tp_mesh: DeviceMesh, sequence_parallel: bool, moe_tokens_replicated: bool
) -> None:
    """A MoE block: attention as in a dense block; the MoE computes on local tensors. With SP it receives
    its sequence shard (tokens differ across tp: what EP with etp == 1 needs), or, with
    ``moe_tokens_replicated`` (ETP, etp == tp), the whole sequence all-gathered over tp, its output cut
    back to the shard."""
    plan = attention_plan(sequence_parallel)
    if sequence_parallel:
        plan["feed_forward"] = PrepareModuleInput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate() if moe_tokens_replicated else Shard(1),),
            use_local_output=True,
        )
    parallelize_module(layer, tp_mesh, plan)
    if sequence_parallel and moe_tokens_replicated:
        parallelize_module(
            layer.feed_forward,
            tp_mesh,
            PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),)),
        )
