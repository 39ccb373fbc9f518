"""Async tensor parallelism: TP+SP's all-gather and reduce-scatter cut into chunks that overlap the matmuls.

Under TP+SP (``tp.py``) each block gathers its sequence-sharded input before the colwise matmuls and
reduce-scatters the rowwise matmul's output: both collectives sit on the critical path, the matmul
waiting for the whole gather, the scatter for the whole matmul. Async TP (torch's
``_fused_all_gather_matmul`` / ``_fused_matmul_reduce_scatter``, torchtitan's
``enable_async_tensor_parallel``) cuts this rank's sequence shard into ``chunks`` pieces:

    all-gather, then matmul:   issue AG(0) .. AG(c-1); matmul my own rows; wait AG(k), matmul its rows
    matmul, then reduce-scatter: matmul chunk k, issue RS(k) (in flight while chunk k+1 multiplies); wait all

so chunk k's communication runs while another chunk's matmul computes. Chunk k holds rows
``[k*p, (k+1)*p)`` of every rank's shard (p = shard / chunks): one all-gather of it gives every rank's
piece k, one reduce-scatter of the rows of piece k gives this rank its piece. The same bytes cross the
wire as with one collective (each chunk moves 1/chunks of it), and the same numbers come out up to the
order of float32 sums. Backward is the mirror image, pipelined the same way: the input gradient of an
all-gather-then-matmul is a matmul-then-reduce-scatter and the other way round; the weight gradients
are computed while the last chunks are in flight.

Every chunk is one traced collective (``comm``, ``async_op``, field ``chunk``). On CUDA with symmetric
memory (``torch.distributed._symmetric_memory``) the two steps are torch's fused kernels instead.

Parameters stay DTensors on the tp mesh (wq/wk/wv/w1 ``Shard(0)``, wo/w2 ``Shard(1)``, what
``ColwiseParallel`` / ``RowwiseParallel`` give) so fully_shard and checkpoints see the same layout as
M3; forward computes on their local shards. Norms, embeddings and the head keep M3's plan.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

from hyper_parallel import comm
from hyper_parallel.comm import GroupInfo
from hyper_parallel.models.transformer import Attention, FeedForward, Transformer, rotary
from hyper_parallel.parallel.tp import check_heads, parallelize_root

SEQ_DIM = 1


def check_chunks(shard_len: int, chunks: int) -> None:
    """A chunk count must cut this rank's sequence shard into whole rows."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"async TP chunks must be a positive integer, got {chunks!r}")
    if shard_len % chunks:
        divisors = [c for c in range(1, shard_len + 1) if shard_len % c == 0]
        raise ValueError(
            f"async TP cuts each rank's sequence shard of {shard_len} tokens into chunks={chunks} pieces, which does "
            f"not divide it; choose chunks from {divisors}"
        )


def _symmetric_memory_group(info: GroupInfo, tensor: torch.Tensor) -> str | None:
    """The process group's name when torch's fused symmetric-memory kernels can run it (CUDA, NCCL)."""
    if tensor.device.type != "cuda" or info.group is None or dist.get_backend(info.group) != "nccl":
        return None  # e.g. torch's threaded test group, whose ranks share one process: no symmetric memory
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(info.group.group_name)
    except (ImportError, RuntimeError):
        return None
    return info.group.group_name


def pipelined_all_gather(
    shard: torch.Tensor, consume: Callable[[torch.Tensor], torch.Tensor], info: GroupInfo, chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``shard`` [rows, ...] over ``info`` in ``chunks`` async all-gathers and apply ``consume`` as they land.

    ``consume(rows)`` maps rows [n, ...] to outputs [n, ...']; it runs on this rank's own shard at
    once (no communication needed), then on the other ranks' rows of each chunk as its all-gather
    completes. Returns (gathered [size * rows, ...], outputs [size * rows, ...']) in rank order."""
    size, me = info.size, info.index
    pieces = shard.reshape(chunks, shard.shape[0] // chunks, *shard.shape[1:])
    flat = [torch.empty((size * pieces.shape[1], *pieces.shape[2:]), dtype=shard.dtype, device=shard.device)]
    flat += [torch.empty_like(flat[0]) for _ in range(chunks - 1)]
    pending = [
        comm.all_gather_into_tensor(buffer, piece, info, async_op=True, chunk=k)
        for k, (buffer, piece) in enumerate(zip(flat, pieces))
    ]
    buffers = [buffer.view(size, *pieces.shape[1:]) for buffer in flat]
    own = consume(shard)
    outputs = torch.empty((size, chunks, *pieces.shape[1:-1], own.shape[-1]), dtype=own.dtype, device=own.device)
    outputs[me] = own.reshape(outputs.shape[1:])
    others = torch.tensor([r for r in range(size) if r != me], device=shard.device)
    for k, work in enumerate(pending):
        work.wait()
        outputs[others, k] = consume(buffers[k][others])
    gathered = torch.stack(buffers, dim=1)  # [size, chunks, p, ...]: rank j's rows in order
    return gathered.flatten(0, 2), outputs.flatten(0, 2)


def pipelined_reduce_scatter(
    produce: Callable[[int], torch.Tensor], rows: int, info: GroupInfo, chunks: int, after_issue: Callable[[], None]
) -> torch.Tensor:
    """Reduce-scatter the rows ``produce`` computes, chunk by chunk, each in flight while the next is computed.

    ``produce(k)`` returns chunk k's rows of every rank [size, p, ...] (rank j's piece k first dim j);
    ``rows`` is this rank's shard length. ``after_issue`` runs once every chunk is in flight (work that
    needs no result of the scatter, e.g. weight gradients). Returns this rank's sum [rows, ...]."""
    pieces, pending = [], []
    for k in range(chunks):
        full = produce(k)
        piece = torch.empty(full.shape[1:], dtype=full.dtype, device=full.device)
        full = full.reshape(-1, *full.shape[2:])  # [size * p, ...], contiguous: rank j's rows j-th
        pending.append(comm.reduce_scatter_tensor(piece, full, info, async_op=True, chunk=k))
        pieces.append(piece)
    after_issue()
    for work in pending:
        work.wait()
    out = torch.stack(pieces)
    return out.reshape(rows, *out.shape[2:])


def _rows_of_chunk(full: torch.Tensor, size: int, chunks: int, k: int) -> torch.Tensor:
    """Chunk k's rows of every rank in a tensor [size * rows, ...] laid out in rank order: [size, p, ...]."""
    return full.reshape(size, chunks, full.shape[0] // (size * chunks), *full.shape[1:])[:, k]


def all_gather_linear(
    shard: torch.Tensor, weights: list[torch.Tensor], info: GroupInfo, chunks: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(gathered rows, [F.linear(gathered, w) for w in weights]) with the gather pipelined; rows on dim 0."""
    group = _symmetric_memory_group(info, shard)
    if group is not None:
        gathered, outs = torch.ops.symm_mem.fused_all_gather_matmul(shard, [w.t() for w in weights], 0, group)
        return gathered, list(outs)
    splits = [w.shape[0] for w in weights]
    stacked = torch.cat(weights) if len(weights) > 1 else weights[0]
    gathered, out = pipelined_all_gather(shard, lambda rows: F.linear(rows, stacked), info, chunks)
    return gathered, list(out.split(splits, dim=-1))


def linear_reduce_scatter(
    full: torch.Tensor,
    weight: torch.Tensor,
    info: GroupInfo,
    chunks: int,
    after_issue: Callable[[], None] = lambda: None,
) -> torch.Tensor:
    """The reduce-scatter over ``info`` of ``F.linear(full, weight)`` (rows on dim 0), pipelined."""
    group = _symmetric_memory_group(info, full)
    if group is not None:
        out = torch.ops.symm_mem.fused_matmul_reduce_scatter(full, weight.t(), "sum", 0, group)
        after_issue()
        return out
    rows = full.shape[0] // info.size
    return pipelined_reduce_scatter(
        lambda k: F.linear(_rows_of_chunk(full, info.size, chunks, k), weight), rows, info, chunks, after_issue
    )


def _weight_grad(grad_out: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """d(F.linear(inputs, w)) / dw for rows on dim 0: grad_out^T @ inputs over every row."""
    return grad_out.reshape(-1, grad_out.shape[-1]).t() @ inputs.reshape(-1, inputs.shape[-1])


class AllGatherLinear(torch.autograd.Function):
    """Forward: all-gather the sequence shard along ``dim`` and apply every colwise weight, pipelined.
    Backward: the summed input gradient matmul-then-reduce-scattered, pipelined; weight gradients while
    its chunks are in flight. One gather feeds wq, wk and wv (M3's ``PrepareModuleInput`` does the same)."""

    @staticmethod
    def forward(ctx, shard, dim, info, chunks, *weights):
        moved = shard.movedim(dim, 0).contiguous()
        gathered, outs = all_gather_linear(moved, list(weights), info, chunks)
        ctx.dim, ctx.info, ctx.chunks, ctx.splits = dim, info, chunks, [w.shape[0] for w in weights]
        ctx.save_for_backward(gathered, *weights)
        return tuple(out.movedim(0, dim) for out in outs)

    @staticmethod
    def backward(ctx, *grads):
        gathered, *weights = ctx.saved_tensors
        grad = torch.cat([g.movedim(ctx.dim, 0) for g in grads], dim=-1)  # [rows, ..., sum of out features]
        stacked = torch.cat(weights) if len(weights) > 1 else weights[0]
        weight_grads: list[torch.Tensor] = []

        def compute_weight_grads() -> None:
            weight_grads.extend(_weight_grad(g, gathered) for g in grad.split(ctx.splits, dim=-1))

        grad_shard = linear_reduce_scatter(grad, stacked.t(), ctx.info, ctx.chunks, compute_weight_grads)
        return (grad_shard.movedim(0, ctx.dim), None, None, None, *weight_grads)


class LinearReduceScatter(torch.autograd.Function):
    """Forward: the rowwise matmul chunk by chunk, each chunk reduce-scattered along ``dim`` while the next
    multiplies. Backward: the output gradient all-gathered in chunks, each multiplied as it lands."""

    @staticmethod
    def forward(ctx, full, weight, dim, info, chunks):
        moved = full.movedim(dim, 0).contiguous()
        ctx.dim, ctx.info, ctx.chunks = dim, info, chunks
        ctx.save_for_backward(moved, weight)
        return linear_reduce_scatter(moved, weight, info, chunks).movedim(0, dim)

    @staticmethod
    def backward(ctx, grad):
        moved, weight = ctx.saved_tensors
        grad_full, (grad_input,) = all_gather_linear(
            grad.movedim(ctx.dim, 0).contiguous(), [weight.t()], ctx.info, ctx.chunks
        )
        return grad_input.movedim(0, ctx.dim), _weight_grad(grad_full, moved), None, None, None


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _shard_weight(linear: nn.Linear, mesh: DeviceMesh, dim: int) -> None:
    weight = linear.weight
    linear.weight = nn.Parameter(distribute_tensor(weight.detach(), mesh, [Shard(dim)], src_data_rank=None))


class AsyncTPAttention(nn.Module):
    """The block's attention with the input gather and the output scatter pipelined; keeps the submodule
    names (wq, wk, wv, wo) and the swappable ``core`` (CP replaces it)."""

    def __init__(self, attention: Attention, tp: GroupInfo, chunks: int) -> None:
        super().__init__()
        self.config, self.core, self.tp, self.chunks = attention.config, attention.core, tp, chunks
        self.wq, self.wk, self.wv, self.wo = attention.wq, attention.wk, attention.wv, attention.wo

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        weights = [_local(w.weight) for w in (self.wq, self.wk, self.wv)]
        q, k, v = AllGatherLinear.apply(x, SEQ_DIM, self.tp, self.chunks, *weights)
        batch, seq = q.shape[:2]
        head_dim, theta = self.config.head_dim, self.config.rope_theta
        q, k, v = (t.view(batch, seq, -1, head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = rotary(q, positions, theta), rotary(k, positions, theta)
        out = self.core(q, k, v, positions).transpose(1, 2).reshape(batch, seq, -1)
        return LinearReduceScatter.apply(out, _local(self.wo.weight), SEQ_DIM, self.tp, self.chunks)


class AsyncTPFeedForward(nn.Module):
    """w2(silu(w1(x))) with w1's input gather and w2's output scatter pipelined; keeps the names w1, w2."""

    def __init__(self, feed_forward: FeedForward, tp: GroupInfo, chunks: int) -> None:
        super().__init__()
        self.w1, self.w2, self.tp, self.chunks = feed_forward.w1, feed_forward.w2, tp, chunks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (h,) = AllGatherLinear.apply(x, SEQ_DIM, self.tp, self.chunks, _local(self.w1.weight))
        return LinearReduceScatter.apply(F.silu(h), _local(self.w2.weight), SEQ_DIM, self.tp, self.chunks)


def parallelize_transformer_async_tp(
    model: Transformer, tp_mesh: DeviceMesh, chunks: int | None = None, sequence_len: int | None = None
) -> Transformer:
    """M3's TP+SP with each block's gather and scatter pipelined in ``chunks`` (default: tp) pieces; in place.

    ``sequence_len``: the tokens each tp group holds (the model's seq_len, or seq_len / cp under CP);
    its tp-th, this rank's shard, must divide into ``chunks``."""
    tp_size = tp_mesh.size()
    if tp_size == 1:
        raise ValueError("async TP pipelines the tp group's collectives: it needs tp > 1")
    config = model.config
    check_heads(config.n_heads, tp_size)
    chunks = tp_size if chunks is None else chunks
    sequence_len = config.seq_len if sequence_len is None else sequence_len
    if sequence_len % tp_size:
        raise ValueError(f"sequence parallelism splits {sequence_len} tokens over tp={tp_size}: not divisible")
    check_chunks(sequence_len // tp_size, chunks)
    if config.moe_layers:
        raise ValueError(
            f"async TP pipelines dense feed-forwards; layers {list(config.moe_layers)} are MoE (use M3 or S2 for them)"
        )
    parallelize_root(model, tp_mesh, sequence_parallel=True)
    tp = GroupInfo.from_mesh(tp_mesh, tuple(tp_mesh.mesh_dim_names))
    norm_plan = {
        "attention_norm": SequenceParallel(use_local_output=True),
        "ffn_norm": SequenceParallel(use_local_output=True),
    }
    for layer in model.layers:
        parallelize_module(layer, tp_mesh, norm_plan)
        attention, feed_forward = layer.attention, layer.feed_forward
        for linear in (attention.wq, attention.wk, attention.wv, feed_forward.w1):
            _shard_weight(linear, tp_mesh, 0)
        for linear in (attention.wo, feed_forward.w2):
            _shard_weight(linear, tp_mesh, 1)
        layer.attention = AsyncTPAttention(attention, tp, chunks)
        layer.feed_forward = AsyncTPFeedForward(feed_forward, tp, chunks)
    return model
