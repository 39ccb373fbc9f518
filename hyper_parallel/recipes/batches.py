"""Each rank's share of a recipe's global batch: rows by data parallelism, sequence chunks by CP.

The global batch and sequence length are the run's options (``recipes/options.py``): the recipe's
defaults unless the user sets them or they do not fit the mesh, so on the meshes where the defaults fit
the single-process reference of a recipe is the same.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hyper_parallel.devices import HOST
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim


def data_parallel_rows(tensor: torch.Tensor, dims: ParallelDims) -> torch.Tensor:
    """This rank's slice of the global batch: ``dp = dp_replicate * dp_shard`` equal slices."""
    if tensor.shape[0] % dims.dp:
        raise ValueError(f"global batch {tensor.shape[0]} is not divisible by dp={dims.dp}")
    rows = tensor.shape[0] // dims.dp
    index = dims.coordinates(dist.get_rank())[MeshDim.DP]
    return tensor[index * rows : (index + 1) * rows]


def sequence_positions(seq_len: int, dims: ParallelDims) -> torch.Tensor:
    """Global positions of the tokens this rank holds: all of them, its load-balanced CP chunks, or with a
    ulysses dim its slice of its ring rank's chunks (on the host, where the batch is drawn)."""
    from hyper_parallel.parallel.sequence_layout import load_balanced_positions, ulysses_ring_positions

    coordinates = dims.coordinates(dist.get_rank())
    with HOST:
        if dims.ulysses > 1:
            return ulysses_ring_positions(
                seq_len, dims.cp, coordinates[MeshDim.CP], dims.ulysses, coordinates[MeshDim.ULYSSES]
            )
        if dims.cp == 1:
            return torch.arange(seq_len)
        return load_balanced_positions(seq_len, dims.cp, coordinates[MeshDim.CP])
