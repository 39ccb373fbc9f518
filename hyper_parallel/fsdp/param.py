"""One managed parameter: its single DTensor layout on the combined mesh and its unsharded form.

Layout (docs/design.md §3). The parameter's model-parallel placements (TP/EP, from its own DTensor) give
the *model-parallel local* tensor (``model_local_shape``) each rank computes with. FSDP shards that
tensor along one axis (``fsdp_axis``) in torch.chunk pieces over the shard dim: the first axis that no model-parallel dim
shards, else axis 0 (then the global layout is a strided shard, ``_StridedShard``). The sharded
DTensor lives on the combined mesh ``(data-parallel dims..., model-parallel dims...)``:

    sharded    (Replicate()?, Shard(fsdp_axis), <mp placements>)      what the optimizer sees
    unsharded  (Replicate()?, Replicate(),      <mp placements>)      what forward computes with

Traces and figures show these placements over the named dims; the sharded DTensor itself (and its
gradient) is built on the combined mesh without its size-1 dims (``roles.without_size_one_dims``), so a
``(dp_replicate=1, fsdp=2, tp=2)`` parameter is a DTensor on ``(fsdp, tp)`` with one placement per dim > 1.

Storage. Every rank keeps its piece padded to ``ceil(n / shard_size)`` along ``fsdp_axis`` in a tensor of
its own (FSDP2's layout: the sharded DTensor's local tensor is a view of it at offset 0, so state dict
entries are views torch.save can write); the all-gather copies the pieces of a unit into one buffer
(``hyper_parallel.fsdp.gather``). The unsharded tensor is a padded full tensor whose storage is freed on
reshard and refilled on unshard, or what a tensor subclass's all-gather extension builds
(``hyper_parallel.fsdp.extension``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.placement_types import Partial, Placement, _StridedShard

from hyper_parallel.comm import GroupInfo
from hyper_parallel.fsdp.extension import GatheredExtension, has_extension, pre_all_gather
from hyper_parallel.fsdp.roles import without_size_one_dims
from hyper_parallel.partial_grad import marked_partial_dims

if TYPE_CHECKING:
    from hyper_parallel.fsdp.unit_mesh import UnitMesh


def union_dims(dims: tuple[str, ...], more: tuple[str, ...]) -> tuple[str, ...]:
    """Mesh dims a gradient is Partial on, after adding another contribution's (sorted, no repeats)."""
    return tuple(sorted(set(dims) | set(more)))


def placements_str(placements: tuple[Placement, ...]) -> str:
    return "(" + ", ".join(str(p) for p in placements) + ")"


@dataclass(frozen=True)
class ParamLayout:
    """Where a parameter lives: its combined mesh, the model-parallel dims of that mesh and their
    placements, and the mesh/placements it computes with (None: a plain tensor)."""

    combined: DeviceMesh
    model_dims: tuple[str, ...]
    model_placements: tuple[Placement, ...]
    compute_mesh: DeviceMesh | None
    compute_placements: tuple[Placement, ...]
    fsdp_axis: int | None = None  # the tensor dim to shard (FSDP2's shard_placement_fn); None: fully_shard's choice


class ShardedParam:
    def __init__(
        self,
        fqn: str,
        owners: list[tuple[nn.Module, str]],
        param: nn.Parameter,
        unit_mesh: UnitMesh,
        layout: ParamLayout,
    ) -> None:
        self.fqn = fqn
        self.owners = owners  # (module, attribute) of every place the parameter is registered (tied weights)
        self.roles = roles = unit_mesh.roles
        self.sharded_group_info = sharded_group = unit_mesh.sharded_group
        self.unsharded_group_info = unit_mesh.unsharded_group
        self.layout = layout
        self.combined_mesh = layout.combined
        self.model_placements = layout.model_placements
        self.requires_grad = param.requires_grad
        local = param.to_local() if isinstance(param, DTensor) else param.detach()
        if local.dim() == 0:
            raise ValueError(
                f"fully_shard cannot shard the 0-d parameter {fqn!r}. Change {fqn} to a 1D tensor with numel "
                "equal to 1."
            )
        self.orig_dtype = local.dtype
        self.model_local_shape = tuple(local.shape)
        self.global_shape = tuple(param.shape)
        self.fsdp_axis = layout.fsdp_axis if layout.fsdp_axis is not None else self._choose_fsdp_axis(local.dim())
        shard_size = self.shard_size
        axis_len = self.model_local_shape[self.fsdp_axis]
        self.chunk = math.ceil(axis_len / shard_size)
        self.padded_shape = list(self.model_local_shape)
        self.padded_shape[self.fsdp_axis] = self.chunk
        self.padded_shape = tuple(self.padded_shape)
        self.padded_numel = math.prod(self.padded_shape)
        index = sharded_group.index if shard_size > 1 else 0
        self.local_len = max(0, min(self.chunk, axis_len - index * self.chunk))
        self.shard_index = index
        self.model_parallel_groups = unit_mesh.model_parallel_groups(layout.combined, layout.model_dims)
        self.marked_partial_dims = self._marked_partial_dims(param)
        self.sharded_placements = self._placements(sharded=True)
        self.unsharded_placements = self._placements(sharded=False)
        self.dtensor_mesh = without_size_one_dims(self.combined_mesh, roles.data_parallel_dims)
        kept = set(self.dtensor_mesh.mesh_dim_names)
        self.dtensor_placements = tuple(
            placement
            for dim, placement in zip(self.combined_mesh.mesh_dim_names, self.sharded_placements)
            if dim in kept
        )
        self.sharded_param: nn.Parameter | None = None
        self.unsharded_param: nn.Parameter | None = None
        self.unsharded_padded: torch.Tensor | None = None
        self.parked = None  # a reduction.ParkedGradient while gradient sync is off
        self.is_meta = local.is_meta
        self._initial_local = local
        self.padded_shard: torch.Tensor | None = None  # this rank's chunk, padded to ``padded_shape``
        self.local_shard: torch.Tensor | None = None  # its unpadded view, the sharded DTensor's local tensor
        self.extension: GatheredExtension | None = None  # set when the shard uses the all-gather extension

    # ----- layout -----
    @property
    def shard_size(self) -> int:
        return self.roles.shard_size

    @property
    def dp_size(self) -> int:
        return self.roles.dp_size

    @property
    def rank_size(self) -> int:
        return self.roles.rank_size

    def _mp_sharded_axes(self) -> set[int]:
        return {p.dim for p in self.model_placements if isinstance(p, (Shard, _StridedShard))}

    def _choose_fsdp_axis(self, ndim: int) -> int:
        taken = self._mp_sharded_axes()
        return next((axis for axis in range(ndim) if axis not in taken), 0)

    def _placements(self, sharded: bool) -> tuple[Placement, ...]:
        result = []
        for dim in self.combined_mesh.mesh_dim_names:
            if dim == self.roles.shard_dim and sharded:
                result.append(self._fsdp_placement())
            elif dim in self.layout.model_dims:
                result.append(self.model_placements[self.layout.model_dims.index(dim)])
            else:
                result.append(Replicate())
        return tuple(result)

    def _fsdp_placement(self) -> Placement:
        if self.fsdp_axis not in self._mp_sharded_axes():
            return Shard(self.fsdp_axis)
        split = 1
        names = self.combined_mesh.mesh_dim_names
        for dim, placement in zip(self.layout.model_dims, self.model_placements):
            if isinstance(placement, (Shard, _StridedShard)) and placement.dim == self.fsdp_axis:
                split *= self.combined_mesh.size(names.index(dim))
        return _StridedShard(self.fsdp_axis, split_factor=split)

    def _marked_partial_dims(self, param: nn.Parameter) -> tuple[str, ...]:
        dims = marked_partial_dims(param)
        unknown = set(dims) - set(self.model_parallel_groups)
        if unknown:
            raise ValueError(
                f"parameter {self.fqn!r} is marked partial over {sorted(unknown)}, which is not "
                f"a model-parallel dim of its mesh ({sorted(self.model_parallel_groups)})"
            )
        return dims

    def partial_groups(self, runtime_partial_dims: tuple[str, ...] = ()) -> list[GroupInfo]:
        """Model-parallel groups over which this parameter's local gradient must be summed (pure-TP fix):
        dims the TP style marked, plus dims where the gradient DTensor came back ``Partial``."""
        dims = union_dims(self.marked_partial_dims, runtime_partial_dims)
        missing = [d for d in dims if d not in self.model_parallel_groups]
        if missing:
            raise RuntimeError(
                f"gradient of {self.fqn!r} is partial over {missing}, but fully_shard has no "
                "group for it; the parameter's DTensor mesh must include those dims"
            )
        return [self.model_parallel_groups[d] for d in dims]

    def local_grad(self, grad: DTensor) -> tuple[torch.Tensor, tuple[str, ...]]:
        """The local gradient in this parameter's model-parallel layout, and the dims it is still Partial on.

        A TP layer can hand back a gradient laid out differently from its parameter (an embedding's
        gradient comes back Replicate for a Shard(0) weight). Such dims are redistributed to the
        parameter's placement (by DTensor); Partial over a dim where the parameter is Replicate is
        left for fully_shard's bucketed all-reduce over that model-parallel group.
        """
        names = grad.device_mesh.mesh_dim_names
        data_parallel = set(self.roles.data_parallel_dims) | set(self.roles.replicate_dims)
        target, partial = list(grad.placements), []
        for index, (have, want) in enumerate(zip(grad.placements, self.layout.compute_placements)):
            if have == want or names[index] in data_parallel:  # data-parallel dims: fully_shard reduces them
                continue
            if isinstance(have, Partial) and isinstance(want, Replicate):
                partial.append(names[index])
            else:
                target[index] = want
        if target != list(grad.placements):
            grad = grad.redistribute(placements=target)
        return grad.to_local(), tuple(partial)

    # ----- storage -----
    def init_sharded(self) -> None:
        """This rank's chunk in a padded tensor of its own (FSDP2's layout): a state dict entry is then a view of
        the parameter that torch.save can write, and in-place loads reach it. ``new_zeros`` on the parameter's
        local tensor keeps a tensor subclass (float8, NF4) that subclass, so its all-gather extension applies.

        A parameter on the meta device (built under ``torch.device("meta")``) has no data to copy: its
        shard stays meta until ``to_empty`` moves the module and ``ShardedParam.adopt`` relinks it."""
        source = self._initial_local
        padded = source.new_zeros(self.padded_shape)
        if not padded.is_meta and self.local_len > 0:
            start = self.shard_index * self.chunk
            with torch.no_grad():
                self._local_of(padded).copy_(source.narrow(self.fsdp_axis, start, self.local_len))
        self.padded_shard = padded
        dtensor = DTensor(self._local_of(padded), self._spec(padded.dtype), requires_grad=False)
        self.sharded_param = nn.Parameter(dtensor, requires_grad=self.requires_grad)
        self.local_shard = self.sharded_param._local_tensor  # nn.Parameter made its own view of the shard
        self._initial_local = None
        self._set_on_owner(self.sharded_param)

    def _local_of(self, padded: torch.Tensor) -> torch.Tensor:
        return padded.narrow(self.fsdp_axis, 0, self.local_len)

    def _spec(self, dtype: torch.dtype) -> DTensorSpec:
        """The sharded DTensor's spec (also its gradient's), made once per dtype: ``DTensor.from_local``
        would rebuild it and go through autograd for every parameter of every step."""
        meta = TensorMeta(torch.Size(self.global_shape), self._global_stride(), dtype)
        self._grad_spec = DTensorSpec(self.dtensor_mesh, self.dtensor_placements, meta)
        return self._grad_spec

    def registered(self) -> nn.Parameter:
        """The parameter the module holds now: ours, or one that ``to_empty`` / ``load_state_dict(assign=True)``
        put in its place."""
        owner, leaf = self.owners[0]
        return owner._parameters[leaf]

    def holds_own_shard(self, registered: nn.Parameter) -> bool:
        """``registered`` is the sharded parameter, still a view of this parameter's padded shard (not moved by
        ``to_empty`` / ``.to``, not replaced by ``load_state_dict(assign=True)``)."""
        return registered is self.sharded_param and registered._local_tensor is self.local_shard

    def adopt(self, registered: nn.Parameter) -> None:
        """Make ``registered`` (a sharded DTensor of this parameter's layout) this parameter's shard again, its
        data copied into a new padded shard on its device and of its dtype, the same object kept, so an
        optimizer built on it still steps the shard that the all-gather reads (as FSDP2's
        ``reset_sharded_param``)."""
        if not isinstance(registered, DTensor) or tuple(registered.shape) != self.global_shape:
            raise RuntimeError(
                f"{self.fqn}: the module now holds a {type(registered).__name__} of shape "
                f"{tuple(registered.shape)} where fully_shard put its sharded DTensor of shape {self.global_shape}; "
                "load sharded state dicts of the same layout (or full ones with set_model_state_dict)"
            )
        source = registered._local_tensor
        padded = source.new_zeros(self.padded_shape)
        local = self._local_of(padded)
        if not padded.is_meta and not source.is_meta:
            with torch.no_grad():
                local.copy_(source.view(local.shape))
        self.padded_shard = padded
        self.orig_dtype = padded.dtype
        registered._local_tensor = local
        registered._spec = self._spec(padded.dtype)
        self.sharded_param, self.local_shard = registered, local
        self._set_on_owner(registered)

    def _global_stride(self) -> tuple[int, ...]:
        return self._contiguous_stride(self.global_shape)

    def init_unsharded(self, dtype: torch.dtype, device: torch.device, alias: torch.Tensor | None) -> None:
        """Create the compute parameter; ``alias`` (shard_size 1, same dtype) shares the sharded storage."""
        if alias is not None:
            self.unsharded_padded = alias.view(self.padded_shape)
        else:
            shape = list(self.padded_shape)
            shape[self.fsdp_axis] = self.chunk * self.shard_size
            self.unsharded_padded = torch.empty(shape, dtype=dtype, device=device)
        local = self.unsharded_padded.narrow(self.fsdp_axis, 0, self.model_local_shape[self.fsdp_axis])
        self.unsharded_param = self.plain_unsharded = self._compute_param(local)
        self.extension_param = None
        if alias is None:
            self.free_unsharded()

    def _compute_param(self, local: torch.Tensor) -> nn.Parameter:
        """The parameter forward computes with: ``local`` itself, or a DTensor on its TP/EP mesh."""
        if self.layout.compute_mesh is not None:
            local = DTensor.from_local(
                local,
                self.layout.compute_mesh,
                self.layout.compute_placements,
                run_check=False,
                shape=torch.Size(self.global_shape),
                stride=self._global_stride(),
            )
        return nn.Parameter(local, requires_grad=self.requires_grad)

    def alloc_unsharded(self) -> None:
        storage = self.unsharded_padded.untyped_storage()
        needed = self.unsharded_padded.numel() * self.unsharded_padded.element_size()
        if storage.size() != needed:
            storage.resize_(needed)

    def free_unsharded(self) -> None:
        if self.extension is not None:
            self.extension.free()
        elif not self.unsharded_padded.is_meta:
            self.unsharded_padded.untyped_storage().resize_(0)

    # ----- all-gather (hyper_parallel.fsdp.gather) -----
    def extension_inputs(self, mp_policy) -> tuple[tuple[torch.Tensor, ...], object] | None:
        """None when this rank's shard is a plain tensor (the group gathers the padded shard itself); else the
        inputs and metadata of its ``fsdp_pre_all_gather`` (``hyper_parallel.fsdp.extension``)."""
        local = self.local_shard
        if not has_extension(local, self.fqn):
            if self.extension is not None:
                self.extension, self.unsharded_param = None, self.plain_unsharded
            return None
        if self.fsdp_axis != 0:
            raise NotImplementedError(
                f"{self.fqn}: the all-gather extension gathers along dim 0, but fully_shard shards this parameter "
                f"along dim {self.fsdp_axis} (dim 0 is sharded by its TP/EP placements)"
            )
        if self.extension is None:
            self.extension = GatheredExtension()
        owner = self.owners[0][0]
        size, padded = torch.Size(self.model_local_shape), torch.Size(self.padded_shape)
        return pre_all_gather(local, self.fqn, self.shard_mesh, size, owner, mp_policy, padded)

    @functools.cached_property
    def shard_mesh(self) -> DeviceMesh:
        """The 1-D mesh of the shard dim, the one FSDP2 hands ``fsdp_pre_all_gather``."""
        mesh, dim = self.roles.mesh, self.roles.shard_dim
        return mesh[dim] if dim is not None else mesh

    def receive(self, rows: list[torch.Tensor], pieces, metadata, param_dtype: torch.dtype) -> None:
        """Fill the unsharded parameter from the gathered pieces (``rows``: [ranks, numel] each)."""
        if self.extension is None:
            self.alloc_unsharded()
            self.copy_out(rows[0])
            return
        sizes = [piece.size for piece in pieces]
        tensor = self.extension.receive(self.local_shard, rows, sizes, metadata, param_dtype, self.extension_param)
        if tensor is not None:  # the first all-gather: the unsharded tensor cut to the parameter's size
            stride = self._contiguous_stride(self.model_local_shape)
            self.extension_param = self._compute_param(torch.as_strided(tensor, self.model_local_shape, stride, 0))
        self.unsharded_param = self.extension_param

    @staticmethod
    def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
        stride, acc = [], 1
        for size in reversed(shape):
            stride.append(acc)
            acc *= size
        return tuple(reversed(stride))

    def copy_out(self, gathered: torch.Tensor) -> None:
        """Fill the unsharded tensor from ``gathered`` ([shard_size, padded_numel] for this parameter)."""
        pieces = gathered.reshape(self.shard_size, *self.padded_shape)
        target = self.unsharded_padded.unflatten(self.fsdp_axis, (self.shard_size, self.chunk))
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(self.unsharded_padded):
            target.copy_(pieces.movedim(0, self.fsdp_axis))

    def copy_cast(self, source: torch.Tensor) -> None:
        """shard_size 1 with a different compute dtype: the unsharded tensor is a cast copy."""
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(self.unsharded_padded):
            self.unsharded_padded.copy_(source.view(self.padded_shape))

    def grad_into(self, grad: torch.Tensor, target: torch.Tensor) -> None:
        """Write an unsharded local gradient into ``target`` ([shard_size, padded_numel]), rank-major chunks."""
        pad = self.chunk * self.shard_size - grad.shape[self.fsdp_axis]
        if pad:
            widths = [0, 0] * (grad.dim() - 1 - self.fsdp_axis) + [0, pad]
            grad = torch.nn.functional.pad(grad, widths)
        pieces = grad.unflatten(self.fsdp_axis, (self.shard_size, self.chunk)).movedim(self.fsdp_axis, 0)
        target.view(self.shard_size, *self.padded_shape).copy_(pieces)

    def sharded_grad(self, padded_grad: torch.Tensor) -> DTensor:
        """The sharded ``.grad`` DTensor from this rank's reduced padded piece.

        Built from a spec made once at init: ``DTensor.from_local`` would rebuild the spec and go
        through autograd for every parameter of every step, a measurable share of a small step.
        """
        local = padded_grad.view(self.padded_shape).narrow(self.fsdp_axis, 0, self.local_len)
        return DTensor(local, self._grad_spec, requires_grad=False)

    def _set_on_owner(self, param: nn.Parameter) -> None:
        for owner, leaf_name in self.owners:
            owner._parameters[leaf_name] = param

    @property
    def trainable(self) -> bool:
        """Follows the sharded parameter, the one the user sees between steps and may freeze or unfreeze."""
        return self.sharded_param.requires_grad

    def sync_requires_grad(self) -> None:
        """Give the compute parameter the sharded one's ``requires_grad`` (frozen parameters get no gradient)."""
        if self.unsharded_param.requires_grad != self.trainable:
            self.unsharded_param.requires_grad_(self.trainable)

    def use_unsharded(self) -> None:
        self._set_on_owner(self.unsharded_param)

    def use_sharded(self) -> None:
        self._set_on_owner(self.sharded_param)

    def mesh_dims(self) -> tuple[str, ...]:
        return tuple(self.combined_mesh.mesh_dim_names)
