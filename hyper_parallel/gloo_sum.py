"""A reduce-scatter on gloo that puts the ring bound on the wire and sums in gloo's own order.

gloo's ``reduce_scatter`` is an all-reduce underneath (torch 2.13): each rank writes 2(n-1)/n of the
buffer to its sockets, twice the (n-1)/n a reduce-scatter needs, and it is slower than an all-reduce of
the same buffer. Here each rank sends every other rank that rank's 1/n of its buffer in one all-to-all
((n-1)/n on the wire) and sums the n pieces it receives, in the order gloo's all-reduce sums them, so the
result is bit for bit gloo's (and torch FSDP2's, which uses gloo's reduce_scatter on CPU).

gloo's order (its ring all-reduce; measured against ``reduce_scatter_tensor`` with torch 2.13 for fp32,
bf16, fp16 and fp64 on 3, 4 and 8 ranks, 36 to 12M elements; ``tests/test_gloo_sum.py`` holds it):

* the buffer is cut into ``segments``: at least 2n, none above 1 MiB, a multiple of n; a segment's bytes
  are the buffer's divided by ``segments``, rounded up to whole elements;
* group position c ends up owning ring chunk c, the ``segments / n`` consecutive segments from
  ``c * segments / n`` (the last chunks may be short or empty);
* each element of ring chunk c is summed ``((x[c-1] + x[c-2]) + ...) + x[c]`` (positions mod n): the
  partial sum travels the ring downwards from position c-1 and ends at c.

The ring chunks are the reduce-scatter's output chunks, except where the segment size was rounded up:
then a few elements at a chunk boundary lie in the neighbouring ring chunk and are summed in its order.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist

MAX_SEGMENT_BYTES = 1 << 20
"""gloo's largest ring segment (measured: 1 MiB reproduces every boundary above 4M elements, 2 MiB does not)."""


class SummedPiece(NamedTuple):
    """A run of this rank's output elements ``[start, stop)`` and the group positions, in summation order,
    whose pieces are added to give it."""

    start: int
    stop: int
    order: tuple[int, ...]


def ring_chunk_numel(numel: int, size: int, element_size: int) -> int:
    """Elements in one ring chunk of gloo's all-reduce of ``numel`` elements over ``size`` ranks."""
    total = numel * element_size
    max_segment = element_size * max(1, MAX_SEGMENT_BYTES // element_size)
    segments = max(math.ceil(total / max_segment), 2 * size)
    segments = math.ceil(segments / size) * size
    segment_bytes = math.ceil(math.ceil(total / segments) / element_size) * element_size
    return segments // size * segment_bytes // element_size


def ring_order(chunk: int, size: int) -> tuple[int, ...]:
    """The group positions in the order gloo sums ring chunk ``chunk``: c-1, c-2, ..., c (mod size)."""
    return tuple((chunk - 1 - step) % size for step in range(size))


def summation_plan(numel: int, size: int, index: int, element_size: int) -> list[SummedPiece]:
    """How position ``index`` sums its 1/size of a ``numel``-element buffer, as gloo's ring would."""
    if numel % size:
        raise ValueError(f"a reduce-scatter buffer of {numel} elements does not split into {size} equal chunks")
    shard = numel // size
    ring = ring_chunk_numel(numel, size, element_size)
    low, high = index * shard, (index + 1) * shard
    pieces, position = [], low
    while position < high:
        chunk = position // ring
        stop = min(high, (chunk + 1) * ring)
        pieces.append(SummedPiece(position - low, stop - low, ring_order(chunk, size)))
        position = stop
    return pieces


def fold(received: torch.Tensor, output: torch.Tensor, plan: list[SummedPiece]) -> None:
    """``output`` <- the sum of ``received``'s rows (one per group position) in ``plan``'s orders.

    One rounding per addition, in the tensor's dtype, as gloo's ``sum`` (bf16 and fp16 are added in fp32
    and rounded back each time, not accumulated in fp32)."""
    for start, stop, order in plan:
        target = output[start:stop]
        torch.add(received[order[0], start:stop], received[order[1], start:stop], out=target)
        for position in order[2:]:
            target.add_(received[position, start:stop])


def uses_gloo(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> bool:
    """Whether a collective on ``tensor`` over ``group`` runs on gloo (a CPU tensor, a gloo backend)."""
    return tensor.device.type == "cpu" and "gloo" in str(dist.get_backend(group))


class DirectReduceScatter:
    """One reduce-scatter as an all-to-all of the chunks and a local sum in gloo's order.

    ``start(async_op)`` issues the all-to-all (returns its work when ``async_op``); ``finish()`` sums
    into ``output`` once it has landed and frees the receive buffer."""

    def __init__(self, output: torch.Tensor, full: torch.Tensor, size: int, index: int, group) -> None:
        if not (output.is_contiguous() and full.is_contiguous()) or full.numel() != size * output.numel():
            raise ValueError(
                f"reduce_scatter needs contiguous tensors with full.numel() == {size} * output.numel(); "
                f"got {full.numel()} and {output.numel()}"
            )
        self.output, self.full, self.group = output, full, group
        self.received = torch.empty((size, output.numel()), dtype=full.dtype, device=full.device)
        self.plan = summation_plan(full.numel(), size, index, full.element_size())

    def start(self, async_op: bool):
        return dist.all_to_all_single(
            self.received, self.full.view(self.received.shape), group=self.group, async_op=async_op
        )

    def finish(self) -> None:
        fold(self.received, self.output.view(-1), self.plan)
        self.received.untyped_storage().resize_(0)
