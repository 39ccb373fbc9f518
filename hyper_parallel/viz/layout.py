"""Which ranks hold which block of a global tensor, from placement strings and ParallelDims (no torch).

Placements are written as torch prints them: ``R``, ``S(d)``, ``_S(d, split)`` (``_StridedShard``),
``P(sum)``. Sharding follows ``torch.chunk``: an axis of length n split k ways gives pieces of
``ceil(n / k)``, the last ones shorter or empty. Application order per tensor axis: every plain
``Shard`` in mesh-dim order first (the model-parallel layout, e.g. TP), then every ``_StridedShard``
(FSDP shards the model-parallel local tensor): ``(_S(0, 2), S(0))`` on ``(fsdp, tp)`` splits the tensor
over tp first and each tp piece over fsdp.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from hyper_parallel.mesh import ParallelDims

_TOKEN = re.compile(r"_S\(\s*(\d+)\s*,\s*(\d+)\s*\)|S\(\s*(\d+)\s*\)|P\([^)]*\)|P|R")


@dataclass(frozen=True)
class Placement:
    kind: str  # "R", "S", "_S", "P"
    dim: int = -1  # tensor axis of S / _S
    split: int = 1  # split factor of _S

    def __str__(self) -> str:
        if self.kind == "S":
            return f"S({self.dim})"
        if self.kind == "_S":
            return f"_S({self.dim}, {self.split})"
        return self.kind


def parse_placements(text: str) -> list[Placement]:
    """``"(R, _S(0, 2), S(0))"`` -> ``[R, _S(0, 2), S(0)]``."""
    result = []
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if match.group(1) is not None:
            result.append(Placement("_S", int(match.group(1)), int(match.group(2))))
        elif match.group(3) is not None:
            result.append(Placement("S", int(match.group(3))))
        else:
            result.append(Placement("P" if token.startswith("P") else "R"))
    return result


def dim_size(dims: ParallelDims, name: str) -> int:
    """Size of a mesh dim, flattened names ('dp_replicate+fsdp') included."""
    sizes = {dim: size for view in dims.views().values() for dim, size in view}
    unknown = [part for part in name.split("+") if part not in sizes]
    if unknown:
        raise ValueError(f"mesh dim {name!r} is not a dim of {dims}; known dims: {sorted(sizes)}")
    return math.prod(sizes[part] for part in name.split("+"))


def dim_coordinate(dims: ParallelDims, rank: int, name: str) -> int:
    """Index of ``rank`` along a mesh dim (a flattened dim counts its parts row-major)."""
    coords = dims.coordinates(rank)
    index = 0
    for part in name.split("+"):
        index = index * dim_size(dims, part) + coords[part]
    return index


def rank_ranges(global_shape, mesh_dims, placements, dims: ParallelDims) -> dict[int, list[tuple[int, int]]]:
    """For every rank, the half-open index range it holds along each tensor axis."""
    if isinstance(placements, str):
        placements = parse_placements(placements)
    if len(placements) != len(mesh_dims):
        raise ValueError(f"{len(placements)} placements for {len(mesh_dims)} mesh dims {list(mesh_dims)}")
    shards = [(p, m) for p, m in zip(placements, mesh_dims) if p.kind == "S"]
    shards += [(p, m) for p, m in zip(placements, mesh_dims) if p.kind == "_S"]
    for placement, _ in shards:
        if not 0 <= placement.dim < len(global_shape):
            raise ValueError(f"placement {placement} shards axis {placement.dim} of a {len(global_shape)}-d tensor")
    result = {}
    for rank in range(dims.world_size):
        ranges = [(0, n) for n in global_shape]
        for placement, mesh_dim in shards:
            lo, hi = ranges[placement.dim]
            length, k = hi - lo, dim_size(dims, mesh_dim)
            chunk = math.ceil(length / k) if length else 0
            index = dim_coordinate(dims, rank, mesh_dim)
            ranges[placement.dim] = (lo + min(index * chunk, length), lo + min((index + 1) * chunk, length))
        result[rank] = ranges
    return result


@dataclass(frozen=True)
class Block:
    """A box of the global tensor held by the same ranks: ``ranges[a] = (lo, hi)`` per axis."""

    ranges: tuple[tuple[int, int], ...]
    owners: tuple[int, ...]


def ownership(global_shape, mesh_dims, placements, dims: ParallelDims) -> list[Block]:
    """The global tensor cut into the coarsest boxes each held by one set of ranks (row-major order)."""
    ranges = rank_ranges(global_shape, mesh_dims, placements, dims)
    cuts = []
    for axis, n in enumerate(global_shape):
        points = {0, n} | {r[axis][0] for r in ranges.values()} | {r[axis][1] for r in ranges.values()}
        points = sorted(p for p in points if 0 <= p <= n)
        cuts.append([(a, b) for a, b in itertools.pairwise(points) if b > a] or [(0, 0)])
    blocks = []

    def walk(axis: int, chosen: list[tuple[int, int]]) -> None:
        if axis == len(global_shape):
            owners = tuple(
                rank
                for rank, held in ranges.items()
                if all(lo <= a and b <= hi and hi > lo for (a, b), (lo, hi) in zip(chosen, held))
            )
            blocks.append(Block(tuple(chosen), owners))
            return
        for segment in cuts[axis]:
            walk(axis + 1, chosen + [segment])

    walk(0, [])
    return blocks


def local_shape(global_shape, mesh_dims, placements, dims: ParallelDims, rank: int = 0) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in rank_ranges(global_shape, mesh_dims, placements, dims)[rank])


def changes(mesh_dims, before, after) -> list[str]:
    """One note per mesh dim: 'fsdp: S(1) → R' or 'tp: S(0) kept'."""
    before = parse_placements(before) if isinstance(before, str) else before
    after = parse_placements(after) if isinstance(after, str) else after
    return [
        f"{dim}: {b} kept" if str(b) == str(a) else f"{dim}: {b} → {a}" for dim, b, a in zip(mesh_dims, before, after)
    ]
