"""torch FSDP2's all-gather extension for tensor subclasses, as torchao's float8 and NF4 weights use it.

A parameter whose local shard defines both methods decides what its all-gather carries:

    fsdp_pre_all_gather(mesh, outer_size, outer_stride, module, mp_policy) -> (inputs, metadata)
        (or the older ``fsdp_pre_all_gather(mesh)``) called on the local shard before every all-gather:
        ``inputs`` are tensors of the padded shard's size (float8 data and its scale, an NF4 block...),
        each gathered along dim 0 over the shard dim's ranks (``mesh``, 1-D);
    fsdp_post_all_gather(outputs, metadata, param_dtype, *, out=None)
        called with the gathered tensors: the first time it returns ``(unsharded tensor, tensors to free
        on reshard)``; later it is given that tensor as ``out`` and fills it (its storage was freed and
        reallocated in between, so an optimizer or module holding it sees the new values).

The methods may also be attached to a plain local tensor (``param._local_tensor.fsdp_pre_all_gather =
...``); they are looked up on every all-gather, as FSDP2 does. The unsharded parameter is the
returned tensor cut to the parameter's own size (FSDP2's ``as_strided`` over the padded rows).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

PRE, POST = "fsdp_pre_all_gather", "fsdp_post_all_gather"


def has_extension(local: torch.Tensor, fqn: str) -> bool:
    """True when ``local`` (a parameter's local shard) defines the extension; one method alone is refused."""
    pre, post = hasattr(local, PRE), hasattr(local, POST)
    if pre != post:
        raise ValueError(
            f"{fqn}: its local shard defines {PRE if pre else POST} but not {POST if pre else PRE}; "
            "the all-gather extension needs both (torch FSDP2's tensor-subclass protocol)"
        )
    return pre


def pre_all_gather(
    local: torch.Tensor,
    fqn: str,
    mesh: DeviceMesh,
    outer_size: torch.Size,
    module: nn.Module,
    mp_policy,
    padded_size: torch.Size,
) -> tuple[tuple[torch.Tensor, ...], Any]:
    """What ``local`` all-gathers: its ``fsdp_pre_all_gather`` inputs (a tuple of tensors) and metadata."""
    hook = getattr(local, PRE)
    arity = len(inspect.signature(hook).parameters)
    if arity == 1:
        inputs, metadata = hook(mesh)
    elif arity == 5:
        stride = _contiguous_stride(outer_size)
        inputs, metadata = hook(mesh, outer_size, stride, module, mp_policy)
    else:
        raise ValueError(
            f"{fqn}: {PRE} takes {arity} arguments; it takes (mesh) or (mesh, outer_size, outer_stride, "
            "module, mp_policy), as torch FSDP2 calls it"
        )
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if tuple(local.shape) != tuple(padded_size) and any(t.shape != padded_size for t in inputs):
        raise ValueError(
            f"{fqn} is unevenly sharded (size {tuple(outer_size)} over {mesh.size()} ranks): {PRE} must return "
            f"inputs of the padded shard's size {tuple(padded_size)}, got {[tuple(t.shape) for t in inputs]}"
        )
    return inputs, metadata


def post_all_gather(
    local: torch.Tensor, outputs: tuple[torch.Tensor, ...], metadata: Any, param_dtype: torch.dtype, out=None
):
    """``fsdp_post_all_gather``: ``(tensor, to_free)`` the first time, fills ``out`` afterwards."""
    hook = getattr(local, POST)
    if out is None:
        return hook(outputs, metadata, param_dtype)
    hook(outputs, metadata, param_dtype, out=out)
    return None


def _contiguous_stride(size: torch.Size) -> tuple[int, ...]:
    stride, acc = [], 1
    for dim in reversed(tuple(size)):
        stride.append(acc)
        acc *= dim
    return tuple(reversed(stride))


class GatheredExtension:
    """The unsharded side of one parameter that uses the extension: the gathered tensors, kept between
    all-gathers with their storage freed on reshard (FSDP2's ``all_gather_outputs``), the tensors
    ``fsdp_post_all_gather`` asked to free, and the unsharded tensor it returned the first time."""

    def __init__(self) -> None:
        self.outputs: list[torch.Tensor] = []
        self.to_free: tuple[torch.Tensor, ...] = ()
        self.to_free_nbytes: tuple[int, ...] = ()  # their storage sizes, to reallocate after a reshard freed them
        self.tensor: torch.Tensor | None = None

    def receive(
        self, local: torch.Tensor, rows: list[torch.Tensor], sizes, metadata: Any, param_dtype: torch.dtype, out
    ) -> torch.Tensor | None:
        """Copy the gathered ``rows`` ([ranks, numel] per input) into the kept outputs and run
        ``fsdp_post_all_gather``: returns the new unsharded tensor the first time, fills ``out`` later."""
        if len(self.outputs) != len(rows):
            self.outputs = [torch.empty(r.numel(), dtype=r.dtype, device=r.device) for r in rows]
        for output, row in zip(self.outputs, rows):
            _alloc(output, output.numel() * output.element_size())
            with torch.no_grad():
                output.view(row.shape).copy_(row)
        gathered = tuple(o.view(-1, *size[1:]) for o, size in zip(self.outputs, sizes))
        if self.tensor is None or out is None:
            self.tensor, to_free = post_all_gather(local, gathered, metadata, param_dtype)
            self.to_free = tuple(to_free)
            self.to_free_nbytes = tuple(t.untyped_storage().nbytes() for t in self.to_free)
            return self.tensor
        for tensor, nbytes in zip(self.to_free, self.to_free_nbytes):
            _alloc(tensor, nbytes)
        post_all_gather(local, gathered, metadata, param_dtype, out=out)
        return None

    def free(self) -> None:
        for tensor in (*self.outputs, *self.to_free):
            if not tensor.is_meta:
                tensor.untyped_storage().resize_(0)


def _alloc(tensor: torch.Tensor, nbytes: int) -> None:
    storage = tensor.untyped_storage()
    if storage.nbytes() != nbytes:
        storage.resize_(nbytes)
