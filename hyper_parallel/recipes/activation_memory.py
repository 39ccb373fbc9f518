"""Activation memory measured: the bytes autograd keeps from a forward until its backward.

The largest memory a parallel style saves is often not parameters but activations (sequence
parallelism keeps norms and residuals on a 1/tp slice of the sequence). This counts them on the run
itself: every tensor autograd saves for backward passes through ``saved_tensors_hooks``; the bytes of
their distinct storages (a DTensor counted by its local shard) are the activation memory of the step,
what this rank would hold at the end of its forward. Storages of the module's parameters are left out
(they are the weights, not activations), so the number is comparable across TP, SP and data parallelism.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn


def _storages(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages that hold ``tensor``'s data; a wrapper subclass (DTensor, the async result of a
    functional collective) holds none itself: its inner tensors (``__tensor_flatten__``) do."""
    if type(tensor) in (torch.Tensor, nn.Parameter) or not hasattr(tensor, "__tensor_flatten__"):
        return [tensor.untyped_storage()]
    names, _ = tensor.__tensor_flatten__()
    inner = (getattr(tensor, name) for name in names)
    return [storage for t in inner if isinstance(t, torch.Tensor) for storage in _storages(t)]


class SavedActivations:
    """Bytes saved for backward while the context is entered (one forward), by distinct storage."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.bytes = 0
        self._seen: set[int] = set()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        for storage in _storages(tensor):
            key = storage.data_ptr()
            if key not in self._seen and key not in self._parameter_storages:
                self._seen.add(key)
                self.bytes += storage.nbytes()
        return tensor

    @contextlib.contextmanager
    def measure(self) -> Iterator[SavedActivations]:
        self.bytes, self._seen = 0, set()
        self._parameter_storages = {s.data_ptr() for p in self.model.parameters() for s in _storages(p)}
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor):
            yield self
