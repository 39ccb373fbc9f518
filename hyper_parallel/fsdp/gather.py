"""What one unit's all-gather carries and where each parameter finds its part of the result.

Every parameter contributes one or more *pieces*: by default its padded shard, cast to the compute dtype
as it is copied in; a tensor subclass with torch FSDP2's all-gather extension contributes what its
``fsdp_pre_all_gather`` returns (``hyper_parallel.fsdp.extension``). The pieces are copied into one flat
buffer, this rank's row of the all-gather (FSDP2's copy-in); pieces of several dtypes travel as bytes.
After the all-gather, row r of ``[ranks, row length]`` is rank r's buffer, so a piece's columns are that
piece from every rank, in rank order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

ALIGN_BYTES = 16  # pieces of a byte buffer start at multiples of this, so each can be viewed in its dtype


@dataclass(frozen=True)
class Piece:
    """One tensor a parameter all-gathers: where it sits in the row (in elements of the row's dtype, bytes
    for a byte row), its length, dtype and shape on one rank."""

    offset: int
    numel: int
    dtype: torch.dtype
    size: torch.Size


@dataclass(frozen=True)
class PackedRow:
    """This rank's all-gather input and, per parameter, its pieces and its extension's metadata."""

    buffer: torch.Tensor
    pieces: list[tuple[Piece, ...]]
    metadata: list[Any]

    @property
    def is_bytes(self) -> bool:
        return self.buffer.dtype == torch.uint8


def default_pieces(params, dtype: torch.dtype) -> list[tuple[Piece, ...]]:
    """Each parameter's padded shard, one after the other, in ``dtype``."""
    pieces, offset = [], 0
    for param in params:
        pieces.append((Piece(offset, param.padded_numel, dtype, torch.Size(param.padded_shape)),))
        offset += param.padded_numel
    return pieces


def pack(params, param_dtype: torch.dtype, mp_policy, device: torch.device) -> PackedRow:
    """Copy every parameter's pieces into one new buffer (cast to ``param_dtype`` for default pieces)."""
    sources, metadata = [], []
    for param in params:
        extension_inputs = param.extension_inputs(mp_policy)
        if extension_inputs is None:
            sources.append(((param.padded_shard.view(-1), param_dtype, torch.Size(param.padded_shape)),))
            metadata.append(None)
        else:
            inputs, meta = extension_inputs
            sources.append(tuple((t.reshape(-1), t.dtype, t.shape) for t in inputs))
            metadata.append(meta)
    dtypes = {dtype for entry in sources for _, dtype, _ in entry}
    as_bytes = len(dtypes) > 1
    pieces, offset = [], 0
    for entry in sources:
        mine = []
        for tensor, dtype, size in entry:
            if as_bytes:
                offset = -(-offset // ALIGN_BYTES) * ALIGN_BYTES
                mine.append(Piece(offset, tensor.numel(), dtype, size))
                offset += tensor.numel() * dtype.itemsize
            else:
                mine.append(Piece(offset, tensor.numel(), dtype, size))
                offset += tensor.numel()
        pieces.append(tuple(mine))
    buffer = torch.empty(offset, dtype=torch.uint8 if as_bytes else dtypes.pop(), device=device)
    tensors = [tensor for entry in sources for tensor, _, _ in entry]
    with torch.no_grad():
        if not as_bytes and all(tensor.dtype == buffer.dtype for tensor in tensors):
            torch.cat(tensors, out=buffer)  # the pieces lie end to end: one copy (FSDP2's all_gather_copy_in)
        else:
            for entry, mine in zip(sources, pieces):
                for (tensor, _, _), piece in zip(entry, mine):
                    piece_of(buffer.view(1, -1), piece, as_bytes).view(-1).copy_(tensor)
    return PackedRow(buffer, pieces, metadata)


def split_copy_out(gathered: torch.Tensor, params, row: PackedRow) -> bool:
    """Fill every parameter's unsharded tensor from ``gathered`` ([ranks, row length]) in one split copy
    (FSDP2's ``split_with_sizes_copy``), where that is the same copy ``ShardedParam.copy_out`` makes one
    parameter at a time: plain pieces lying end to end, every parameter sharded on its dim 0 (rank r's rows
    are then row r of its unsharded tensor viewed as [ranks, padded numel]). False, copying nothing, otherwise."""
    sizes = [piece.numel for entry in row.pieces for piece in entry]
    plain = not row.is_bytes and all(param.extension is None for param in params) and len(sizes) == len(params)
    if not plain or sum(sizes) != gathered.shape[1] or any(param.fsdp_axis != 0 for param in params):
        return False
    for param in params:
        param.alloc_unsharded()
    outs = [param.unsharded_padded.view(gathered.shape[0], -1) for param in params]
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(tuple(outs)):
        torch.split_with_sizes_copy(gathered, sizes, dim=1, out=outs)
    return True


def piece_of(rows: torch.Tensor, piece: Piece, as_bytes: bool) -> torch.Tensor:
    """The columns of ``rows`` ([ranks, row length]) that hold ``piece``: [ranks, piece numel] in its dtype."""
    if not as_bytes:
        return rows[:, piece.offset : piece.offset + piece.numel]
    nbytes = piece.numel * piece.dtype.itemsize
    return rows[:, piece.offset : piece.offset + nbytes].view(piece.dtype)
