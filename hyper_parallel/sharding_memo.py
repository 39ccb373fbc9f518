"""DTensor's sharding decisions kept from one warm-pool run to the next, without the runs' meshes.

The first DTensor op of each kind in a run asks the sharding propagator for its output placements; uncached,
that enumerates every combination of single-dim strategies over the mesh (S2's first step: ~0.3 s of ~0.6 s,
a later step ~0.2 s). torch caches the answers keyed by the op's ``OpSchema``, whose specs hold the
``DeviceMesh`` and so its process groups; the warm pool clears those caches after every run
(``mesh_views.clear_mesh_caches``) so that a finished run's groups, threads and sockets go, and the next run
pays every propagation again although its meshes have the same shape.

``install`` puts a memo under the propagator's own caches: its key is the schema with each mesh replaced
by what DeviceMesh's equality compares (ranks, layout, device type, dim names, thread), so a new mesh of the
same shape finds the answer; its value is the answer with each mesh left out, and a hit rebuilds the specs
on the asking op's own mesh. It holds no mesh, no group and no tensor. The decision is the one torch would
recompute: propagation reads only what the key holds (torch's own cache already hands one run's answer to
any equal mesh), so the numbers are unchanged bit for bit. An argument it cannot key by value (a tensor, a
symbolic size, an object hashed by identity) is left to torch.
"""

from __future__ import annotations

import collections
import contextlib
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OutputSharding
from torch.distributed.tensor._sharding_prop import LocalLRUCache, ShardingPropagator
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard, _StridedShard

MAX_ENTRIES = 50_000
"""Answers kept (least recently used dropped first); a recipe run asks ~100 distinct ones, each a few
hundred bytes."""

_PLAIN_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_VALUE_PLACEMENTS = (Shard, _StridedShard, Replicate, Partial)
"""Placements that are plain values (a ``_MaskPartial`` carries a mask buffer an op fills: left to torch)."""
_SEQUENCES = (list, tuple)


class _NotKeyable(Exception):
    """An argument that cannot be compared by value across runs: the op is left to torch uncached."""


@dataclass(frozen=True)
class _SpecWithoutMesh:
    """A DTensorSpec's fields but its mesh, which is named by its equality key."""

    mesh_key: tuple
    placements: tuple[Placement, ...]
    tensor_meta: TensorMeta | None
    shard_order: Any
    use_strided_shard_as_shard_order: bool | None


@dataclass(frozen=True)
class _SchemaWithoutMesh:
    op: Any
    args_schema: Any
    kwargs_schema: Any
    schema_info: Any


def _mesh_key(mesh) -> tuple:
    """What ``DeviceMesh.__eq__`` compares: equal keys, interchangeable meshes for sharding propagation."""
    return mesh._hash_key()


def _value_key(value: Any, meshes: dict) -> Any:
    """``value`` as a hashable key compared by value; each spec's mesh goes into ``meshes`` by its key."""
    if isinstance(value, DTensorSpec):
        mesh_key = _mesh_key(value.mesh)
        meshes[mesh_key] = value.mesh
        return ("spec", _spec_without_mesh(value, mesh_key))
    if type(value) in _SEQUENCES:
        return (type(value).__name__, tuple(_value_key(item, meshes) for item in value))
    if type(value) is torch.Size:
        return ("size", _plain_ints(value))
    if _is_plain(value):
        return (type(value).__name__, value)
    raise _NotKeyable(type(value).__name__)


def _is_plain(value: Any) -> bool:
    """A value compared and hashed by value, holding no tensor or mesh."""
    return type(value) in _PLAIN_TYPES or type(value) in _VALUE_PLACEMENTS or isinstance(value, enum.Enum)


def _plain_ints(values) -> tuple[int, ...]:
    """Sizes and strides as ints; a symbolic one (tracing) is not keyable."""
    if not all(type(item) is int for item in values):
        raise _NotKeyable("symbolic size")
    return tuple(values)


def _spec_without_mesh(spec: DTensorSpec, mesh_key: tuple) -> _SpecWithoutMesh:
    if not all(type(placement) in _VALUE_PLACEMENTS for placement in spec.placements):
        raise _NotKeyable("placement")
    meta = spec.tensor_meta
    if meta is not None:
        meta = TensorMeta(torch.Size(_plain_ints(meta.shape)), _plain_ints(meta.stride), meta.dtype)
    strided = spec.use_strided_shard_as_shard_order
    return _SpecWithoutMesh(mesh_key, spec.placements, meta, None if strided else spec.shard_order, strided)


def _schema_key(schema: OpSchema, meshes: dict) -> tuple:
    """Every argument of the op (finer than torch's own key, which skips some non-static ones) and this
    rank: a pool worker keeps its rank across runs, and nothing here may depend on one it does not."""
    kwargs = tuple(sorted((name, _value_key(value, meshes)) for name, value in schema.kwargs_schema.items()))
    rank = dist.get_rank() if dist.is_initialized() else None
    return (schema.op, _value_key(schema.args_schema, meshes), kwargs, rank)


def _without_mesh(value: Any) -> Any:
    """An answer of the propagator with each DTensorSpec's mesh left out (``_on_mesh`` puts one back)."""
    if isinstance(value, DTensorSpec):
        return _spec_without_mesh(value, _mesh_key(value.mesh))
    if isinstance(value, OpSchema):
        kwargs = {name: _without_mesh(item) for name, item in value.kwargs_schema.items()}
        return _SchemaWithoutMesh(value.op, _without_mesh(value.args_schema), kwargs, value.schema_info)
    if type(value) in _SEQUENCES:
        return type(value)(_without_mesh(item) for item in value)
    if type(value) is torch.Size:
        return torch.Size(_plain_ints(value))
    if _is_plain(value):
        return value
    raise _NotKeyable(type(value).__name__)


def _on_mesh(value: Any, meshes: dict) -> Any:
    """The stored answer rebuilt on the asking op's meshes (``meshes``: equality key -> mesh)."""
    if isinstance(value, _SpecWithoutMesh):
        return DTensorSpec(
            meshes[value.mesh_key],
            value.placements,
            tensor_meta=value.tensor_meta,
            shard_order=value.shard_order,
            use_strided_shard_as_shard_order=value.use_strided_shard_as_shard_order,
        )
    if isinstance(value, _SchemaWithoutMesh):
        kwargs = {name: _on_mesh(item, meshes) for name, item in value.kwargs_schema.items()}
        return OpSchema(value.op, _on_mesh(value.args_schema, meshes), kwargs, schema_info=value.schema_info)
    if type(value) in _SEQUENCES:
        return type(value)(_on_mesh(item, meshes) for item in value)
    return value


def _mesh_keys(value: Any) -> set:
    """The mesh keys a stored answer names (each must be one of the asking op's meshes)."""
    if isinstance(value, _SpecWithoutMesh):
        return {value.mesh_key}
    if isinstance(value, _SchemaWithoutMesh):
        return _mesh_keys(value.args_schema) | _mesh_keys(tuple(value.kwargs_schema.values()))
    if type(value) in _SEQUENCES:
        return set().union(*(_mesh_keys(item) for item in value))
    return set()


@dataclass(frozen=True)
class _Answer:
    output_spec: Any
    redistribute_schema: Any
    needs_redistribute: bool
    use_val_from_redistribute_schema: bool


class ShardingMemo:
    """The propagator's uncached entry point, answered from earlier runs when the schema matches by value."""

    def __init__(self, propagate: Callable[[OpSchema], OutputSharding]) -> None:
        self._propagate = propagate
        self._answers: collections.OrderedDict[tuple, _Answer] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    def __call__(self, schema: OpSchema) -> OutputSharding:
        meshes: dict = {}
        try:
            key = _schema_key(schema, meshes)
        except _NotKeyable:
            return self._propagate(schema)
        answer = self._answers.get(key)
        if answer is not None:
            self._answers.move_to_end(key)
            self.hits += 1
            return OutputSharding(
                _on_mesh(answer.output_spec, meshes),
                _on_mesh(answer.redistribute_schema, meshes),
                answer.needs_redistribute,
                answer.use_val_from_redistribute_schema,
            )
        self.misses += 1
        result = self._propagate(schema)
        self._remember(key, result, meshes)
        return result

    def _remember(self, key: tuple, result: OutputSharding, meshes: dict) -> None:
        try:
            answer = _Answer(
                _without_mesh(result.output_spec),
                _without_mesh(result.redistribute_schema),
                result.needs_redistribute,
                result.use_val_from_redistribute_schema,
            )
        except _NotKeyable:
            return
        if not (_mesh_keys(answer.output_spec) | _mesh_keys(answer.redistribute_schema)) <= meshes.keys():
            return  # an answer on a mesh the op was not given could not be rebuilt from the next asker
        self._answers[key] = answer
        if len(self._answers) > MAX_ENTRIES:
            self._answers.popitem(last=False)


def install(propagator: ShardingPropagator | None = None) -> ShardingMemo:
    """Put a ``ShardingMemo`` under ``propagator``'s caches (DTensor's own by default); idempotent.

    The Python LRU cache and the C++ one stay above it and are still cleared between runs; only their
    misses reach the memo."""
    propagator = propagator or DTensor._op_dispatcher.sharding_propagator
    current = propagator.__dict__.get("propagate_op_sharding_non_cached")
    if isinstance(current, ShardingMemo):
        return current
    memo = ShardingMemo(propagator.propagate_op_sharding_non_cached)
    _put_under(propagator, memo)
    return memo


def _put_under(propagator: ShardingPropagator, memo: ShardingMemo) -> None:
    """``memo`` as the propagator's uncached entry point, under a fresh Python LRU cache."""
    propagator.propagate_op_sharding_non_cached = memo
    propagator.propagate_op_sharding = LocalLRUCache(memo)


def uninstall(propagator: ShardingPropagator | None = None) -> None:
    """torch's own entry points back (a fresh, empty Python cache); nothing if no memo is installed."""
    propagator = propagator or DTensor._op_dispatcher.sharding_propagator
    if isinstance(propagator.__dict__.get("propagate_op_sharding_non_cached"), ShardingMemo):
        del propagator.propagate_op_sharding_non_cached
        propagator.propagate_op_sharding = LocalLRUCache(propagator.propagate_op_sharding_non_cached)


@contextlib.contextmanager
def bypassed(propagator: ShardingPropagator | None = None) -> Iterator[None]:
    """torch's own propagation inside (what a fresh launch pays: the benchmark's cold steps on a warm pool),
    the same memo with its answers back after; nothing changes where none is installed."""
    propagator = propagator or DTensor._op_dispatcher.sharding_propagator
    memo = propagator.__dict__.get("propagate_op_sharding_non_cached")
    if not isinstance(memo, ShardingMemo):
        yield
        return
    uninstall(propagator)
    try:
        yield
    finally:
        _put_under(propagator, memo)
