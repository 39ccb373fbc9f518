"""Train a parallelized workload next to its single-process reference and compare them.

The reference is an unparallelized copy of the model (same seed, same initial weights) trained by
rank 0 alone on the whole global batch; the parallel model trains on each rank's share. Losses are
compared every step, parameters (``full_tensor()``) after the last step. SGD without momentum keeps
the comparison sensitive to gradient scale (Adam would hide a wrongly scaled gradient).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from hyper_parallel import trace
from hyper_parallel.recipes.activation_memory import SavedActivations

RTOL, ATOL = 1e-5, 1e-6


@dataclass
class Workload:
    model: nn.Module  # parallelized
    reference: nn.Module  # same initial weights, not parallelized
    inputs: tuple  # model(*inputs): this rank's share of the global batch
    targets: torch.Tensor
    global_inputs: tuple  # reference(*global_inputs): the whole global batch
    global_targets: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    lr: float = 0.05
    notes: dict = field(default_factory=dict)  # recipe-specific facts for the summary
    step_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """Entered around each training step's forward and backward (float8 on gloo: ``Float8WireAsBytes``)."""
    reference_slices: int = 1
    """The reference steps on the global batch in this many equal row slices (gradients accumulated, loss the
    mean of the slices'), where the parallel result depends on which rows a rank sees: float8's dynamic
    scales take each data-parallel rank's own activation amax, so M3-F8 on dp ranks is compared with a
    reference that scales each dp rank's rows by their own amax."""

    def to(self, device: torch.device) -> Workload:
        """The batch and the reference on ``device`` (the parallel model is already on its mesh's device:
        TP, EP and fully_shard place its parameters there). Batches are drawn on the CPU's generator, so a
        run draws the same numbers on any device."""
        self.inputs = tuple(_moved(value, device) for value in self.inputs)
        self.global_inputs = tuple(_moved(value, device) for value in self.global_inputs)
        self.targets, self.global_targets = _moved(self.targets, device), _moved(self.global_targets, device)
        self.reference.to(device)
        return self


def _moved(value, device: torch.device):
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _full(param: torch.Tensor) -> torch.Tensor:
    return param.full_tensor() if isinstance(param, DTensor) else param.detach()


def _reference_step(workload: Workload) -> float:
    """Forward and backward of the reference on the global batch (in ``reference_slices`` row slices); its loss."""
    slices = workload.reference_slices
    rows = workload.global_targets.shape[0]
    if rows % slices:
        raise ValueError(f"global batch {rows} does not split into {slices} reference slices")
    step = rows // slices
    total = 0.0
    for index in range(slices):
        part = slice(index * step, (index + 1) * step)
        inputs = tuple(tensor[part] for tensor in workload.global_inputs)
        loss = workload.loss_fn(workload.reference(*inputs), workload.global_targets[part]) / slices
        loss.backward()
        total += loss.item()
    return total


def train_and_compare(
    workload: Workload,
    steps: int,
    on_step: Callable[[dict], None] | None = None,
    trace_torch_collectives: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> dict:
    """Run ``steps`` optimizer steps; return losses, reference losses and the largest differences (rank 0).

    ``trace_torch_collectives`` makes a context that records the collectives torch issues itself
    (DTensor TP); it is entered around the training step only, not around the reference or the checks.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model, reference = workload.model, workload.reference
    optimizer = torch.optim.SGD(model.parameters(), lr=workload.lr)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=workload.lr) if rank == 0 else None
    losses, ref_losses, step_times = [], [], []
    saved = SavedActivations(model)
    for step in range(steps):
        trace.set_step(step)
        start = time.perf_counter()
        with workload.step_context(), trace_torch_collectives():
            with saved.measure():
                loss = workload.loss_fn(model(*workload.inputs), workload.targets)
            loss.backward()
            trace.set_phase("optimizer")
            optimizer.step()
            optimizer.zero_grad()
            trace.set_phase("other")
        step_times.append(time.perf_counter() - start)
        total = loss.detach().to(torch.float64).reshape(1).clone()
        dist.all_reduce(total)  # bookkeeping, not part of the training communication: not traced
        losses.append(total.item() / world)
        if ref_optimizer is not None:
            ref_losses.append(_reference_step(workload))
            ref_optimizer.step()
            ref_optimizer.zero_grad()
            if on_step is not None:
                on_step({"step": step + 1, "steps": steps, "loss": losses[-1], "reference": ref_losses[-1]})
    max_param_diff, mismatched = 0.0, []
    reference_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        full = _full(param)
        if rank == 0:
            expected = reference_params[name].detach()
            diff = (full.float() - expected.float()).abs().max().item()
            max_param_diff = max(max_param_diff, diff)
            if not torch.allclose(full.float(), expected.float(), rtol=RTOL, atol=ATOL):
                mismatched.append(name)
    if rank != 0:
        return {}
    max_loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses))
    losses_ok = all(abs(a - b) <= ATOL + RTOL * abs(b) for a, b in zip(losses, ref_losses))
    return {
        "losses": losses,
        "reference_losses": ref_losses,
        "max_abs_diff": max_loss_diff,
        "max_param_diff": max_param_diff,
        "mismatched_params": mismatched,
        "ok": losses_ok and not mismatched,
        "step_times": step_times,
        "saved_activation_bytes": saved.bytes,  # rank 0, last step (recipes.activation_memory)
        "notes": workload.notes,
    }
