"""Which tokens of a sequence each cp rank holds: the zig-zag (load-balanced) layout, or contiguous blocks.

Why zig-zag. With a causal mask, query ``p`` attends to keys ``0..p``: a contiguous split would leave the
rank holding the first tokens nearly idle and the last one doing most of the work. The sequence is cut
into ``2*cp`` equal chunks and rank ``i`` holds chunks ``i`` and ``2*cp-1-i`` (one early, one late), so
every rank does the same amount of causal work (ring-flash-attention's zig-zag, TorchTitan, Megatron-LM).
Example, S=16, cp=2: rank 0 holds [0..3, 12..15], rank 1 holds [4..11]. The contiguous layout (rank ``i``
holds chunk ``i`` of ``cp``) is kept to show the imbalance it causes (``ring.py``, tests, notebook 04).

Every rank already has the full tensor (same data loader over dp), so sharding is a local index_select;
unsharding (outputs, tests) is one all-gather and a reorder.
"""

from __future__ import annotations

import torch

from hyper_parallel.comm import GroupInfo
from hyper_parallel.parallel.autograd_comm import AllGatherWithSplitBackward


def load_balanced_positions(seq_len: int, cp_size: int, cp_index: int) -> torch.Tensor:
    """Global positions held by cp rank ``cp_index``, in local order: chunk ``i`` then chunk ``2*cp-1-i``."""
    _check_index(cp_size, cp_index)
    if seq_len < 1 or seq_len % (2 * cp_size):
        raise ValueError(
            f"seq_len={seq_len} must be a positive multiple of 2*cp = {2 * cp_size}: load-balanced (zig-zag) "
            f"context parallelism cuts the sequence into 2*cp equal chunks, two per rank; nearest valid seq_len: "
            f"{max(2 * cp_size, round(seq_len / (2 * cp_size)) * 2 * cp_size)}"
        )
    chunk = seq_len // (2 * cp_size)
    first, second = cp_index, 2 * cp_size - 1 - cp_index
    return torch.cat(
        [torch.arange(first * chunk, (first + 1) * chunk), torch.arange(second * chunk, (second + 1) * chunk)]
    )


def contiguous_positions(seq_len: int, cp_size: int, cp_index: int) -> torch.Tensor:
    """Global positions held by cp rank ``cp_index`` when the sequence is cut into cp blocks in order."""
    _check_index(cp_size, cp_index)
    if seq_len < 1 or seq_len % cp_size:
        raise ValueError(f"seq_len={seq_len} must be a positive multiple of cp = {cp_size} (cp equal blocks)")
    block = seq_len // cp_size
    return torch.arange(cp_index * block, (cp_index + 1) * block)


def rank_positions(seq_len: int, cp_size: int, cp_index: int, zigzag: bool = True) -> torch.Tensor:
    """The positions of one cp rank in the zig-zag layout, or in contiguous blocks (``zigzag=False``)."""
    layout = load_balanced_positions if zigzag else contiguous_positions
    return layout(seq_len, cp_size, cp_index)


def ulysses_ring_positions(
    seq_len: int, ring_size: int, ring_index: int, ulysses_size: int, ulysses_index: int
) -> torch.Tensor:
    """2-D sequence parallelism: the positions of the rank at (ring index, ulysses index). Its ring rank's
    zig-zag share (chunks i and 2 ring - 1 - i) is cut into ``ulysses_size`` contiguous slices in order, so
    that an all-to-all over the ulysses ranks gathers the share back in zig-zag order for the ring."""
    share = load_balanced_positions(seq_len, ring_size, ring_index)
    _check_index(ulysses_size, ulysses_index)
    if len(share) % ulysses_size:
        raise ValueError(
            f"seq_len={seq_len}: each ring rank's {len(share)} tokens must split over ulysses={ulysses_size}; "
            f"use a seq_len divisible by 2*ring*ulysses = {2 * ring_size * ulysses_size}"
        )
    return share.chunk(ulysses_size)[ulysses_index]


def gathered_positions(seq_len: int, cp_size: int, zigzag: bool = True) -> torch.Tensor:
    """Positions of every rank concatenated in group rank order: the order of an all-gathered sequence
    (also the sequence order Ulysses attends over after its all-to-all, and the blocks of a ring)."""
    return torch.cat([rank_positions(seq_len, cp_size, i, zigzag) for i in range(cp_size)])


def checked_positions(
    positions: torch.Tensor, s_local: int, cp: GroupInfo, zigzag: bool = True
) -> tuple[torch.Tensor, int]:
    """The gathered sequence's positions and this rank's index, after checking that ``positions`` are
    this rank's chunks (the inputs must have been sharded with ``shard_sequence``)."""
    layout = gathered_positions(s_local * cp.size, cp.size, zigzag).to(positions.device)
    index = cp.index
    if not torch.equal(positions, layout[index * s_local : (index + 1) * s_local]):
        name = "load_balanced_positions" if zigzag else "contiguous_positions"
        raise ValueError(
            f"positions of cp rank {index} must be {name}({s_local * cp.size}, {cp.size}, {index}) "
            f"(use shard_sequence on the inputs and on the position ids); got {positions.tolist()}"
        )
    return layout, index


def shard_sequence(tensor: torch.Tensor, dim: int, cp: GroupInfo, zigzag: bool = True) -> torch.Tensor:
    """This rank's tokens of a full-sequence tensor (inputs, targets, position ids): a local index_select.

    A cp group of one returns ``tensor`` unchanged (and then any length is allowed).
    """
    if cp.size == 1:
        return tensor
    positions = rank_positions(tensor.shape[dim], cp.size, cp.index, zigzag)
    return tensor.index_select(dim, positions.to(tensor.device))


def unshard_sequence(tensor: torch.Tensor, dim: int, cp: GroupInfo, zigzag: bool = True) -> torch.Tensor:
    """The full sequence in global order from every rank's shard: one all-gather, then a reorder.

    Autograd: the gradient reaching the full tensor is taken to be the same on every rank (a loss
    each rank computes identically on the gathered tensor), so backward keeps this rank's tokens
    without communication. Use it to gather outputs and in tests, not inside a model.
    """
    if cp.size == 1:
        return tensor
    dim = dim % tensor.dim()
    order = torch.argsort(gathered_positions(tensor.shape[dim] * cp.size, cp.size, zigzag)).to(tensor.device)
    gathered = AllGatherWithSplitBackward.apply(tensor, dim, cp)
    return gathered.index_select(dim, order)


def _check_index(cp_size: int, cp_index: int) -> None:
    if cp_size < 1 or not 0 <= cp_index < cp_size:
        raise ValueError(
            f"cp_index must be in [0, cp_size) with cp_size >= 1, got cp_index={cp_index}, cp_size={cp_size}"
        )
