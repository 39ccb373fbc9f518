"""Gradient reduction of one fully_shard unit: what it reduces, how sums carry across micro-steps, and the
reduction in flight.

A unit reduces every trainable parameter it holds, whether or not this rank computed a gradient for it:
a parameter without a local gradient contributes zeros, so every rank's reduce-scatter buffer has the
same layout and the collectives never disagree. Which parameters then get a ``.grad``:

    default                  those with a local gradient: one process's ``None`` for a parameter that no rank
                             used (a head the loss skips). A parameter another rank used but this one did not
                             (an MoE expert that got no token here) is detected (its reduced shard is not
                             zero) and refused with the fix:
    unused params reduced    (``set_reduce_scatter_unused_params(True)``, as FSDP2) every trainable parameter:
                             the others' sum where another rank used it, zeros where no rank did

Across micro-steps (gradient accumulation), sums are kept in the reduce dtype, as FSDP2:

    sync off               the local gradient is parked (``ParkedGradient``), cast to the reduce dtype;
                           the next micro-step adds its gradient to it
    HSDP, all-reduce off   the reduce-scattered shard is kept (``PartialReduction``) and added to the next
                           micro-step's before its all-reduce

In flight (``GradientReduction``), with overlap the collectives are issued asynchronously and each stage
is waited for only when its result is needed: when the next unit starts its reduction (which moves every
reduction in flight one stage on) or at the end of backward (which finishes them all, before the
optimizer reads ``.grad``). So while unit k's reduce-scatter is on the wire, backward computes unit k-1.

    issued          reduce-scatter in flight (shard_size > 1)
    advance()       wait for it; HSDP: add the earlier micro-steps' partial sum, issue the all-reduce
    advance()       wait for the all-reduce; sum partial TP/EP gradients; divide; write ``.grad``

Without overlap every stage runs at once. Either way the same collectives reduce the same buffers in
the same order, so the gradients are bit for bit the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, auto
from typing import NamedTuple

import torch

from hyper_parallel import comm
from hyper_parallel.comm import GroupInfo, PendingCollective
from hyper_parallel.fsdp.param import ShardedParam, union_dims


class ReduceScatterInFlight(NamedTuple):
    """A reduce-scatter issued and not yet waited for, and its input buffer (released once it lands)."""

    work: PendingCollective
    reduce_in: torch.Tensor


class ParkedGradient(NamedTuple):
    """A parameter's local gradient kept while gradient sync is off, and the model-parallel dims it is
    still Partial on."""

    grad: torch.Tensor
    partial_dims: tuple[str, ...]


@dataclass
class Contribution:
    """What one reduction carries: the flat buffer of the unit's trainable parameters (``offsets`` into it)
    and, per parameter, the model-parallel dims its gradient is still Partial on."""

    reduced: torch.Tensor
    offsets: dict[int, int]
    partial_dims: dict[int, tuple[ShardedParam, tuple[str, ...]]]
    locally_used: set[int]  # id(param) of those with a gradient computed on this rank

    def add(self, earlier: Contribution) -> None:
        """Add an earlier micro-step's reduce-scattered sum (HSDP accumulation) into this one."""
        if earlier.offsets != self.offsets:
            raise RuntimeError(
                "requires_grad of a unit's parameters changed between micro-steps of one gradient "
                "accumulation; freeze or unfreeze between optimizer steps"
            )
        self.reduced += earlier.reduced
        self.locally_used |= earlier.locally_used
        for key, (param, dims) in earlier.partial_dims.items():
            mine = self.partial_dims.get(key, (param, ()))[1]
            self.partial_dims[key] = (param, union_dims(mine, dims))


class ReductionStage(Enum):
    REDUCE_SCATTER = auto()  # issued; its result (this rank's summed shard) not yet waited for
    ALL_REDUCE = auto()  # HSDP: the reduce-scatter's result being summed over the replicas
    DONE = auto()  # gradients written (or kept as the HSDP partial sum)


@dataclass
class HeldPartialSum:
    """HSDP with the all-reduce off (gradient accumulation): the reduce-scattered sum a unit keeps until a
    later micro-step all-reduces it. One record, shared by the unit and its reduction in flight."""

    contribution: Contribution | None = None

    def take(self) -> Contribution | None:
        """The sum kept so far, which the caller now owns (None when there is none)."""
        earlier, self.contribution = self.contribution, None
        return earlier


@dataclass
class ReductionTarget:
    """Where a reduction ends: the unit's groups, divide factor and dtype, and the HSDP partial sum it adds
    to or is kept as (``held``, the unit's own record)."""

    name: str
    unsharded_group: GroupInfo
    dp_size: int
    divide_factor: float  # what is left to divide after the collectives (``divide_factors``)
    orig_dtype: torch.dtype
    requires_all_reduce: bool
    reduce_unused: bool
    held: HeldPartialSum
    all_reduce_hook: Callable[[torch.Tensor], None] | None = None  # set_all_reduce_hook: on the reduced shard


class GradientReduction:
    def __init__(
        self,
        target: ReductionTarget,
        contribution: Contribution,
        scatter: ReduceScatterInFlight | None,
        async_op: bool,
    ) -> None:
        self.target, self.contribution, self.async_op = target, contribution, async_op
        self.stage = ReductionStage.REDUCE_SCATTER
        self._scatter = scatter
        self._all_reduce: PendingCollective | None = None

    def advance(self) -> bool:
        """Wait for the stage in flight and start the next; True when the gradients are written."""
        target = self.target
        if self.stage is ReductionStage.REDUCE_SCATTER:
            if self._scatter is not None:
                self._scatter.work.wait()
                comm.release(self._scatter.reduce_in)
                self._scatter = None
            if target.dp_size > 1:
                earlier = target.held.take()
                if earlier is not None:
                    self.contribution.add(earlier)
                if not target.requires_all_reduce:
                    target.held.contribution = self.contribution  # HSDP accumulation: all-reduced by a later step
                    self.stage = ReductionStage.DONE
                    return True
                reduced = self.contribution.reduced
                if self.async_op:
                    self._all_reduce = comm.all_reduce(
                        reduced, target.unsharded_group, module=target.name, async_op=True
                    )
                    self.stage = ReductionStage.ALL_REDUCE
                    return False
                comm.all_reduce(reduced, target.unsharded_group, module=target.name)
        elif self.stage is ReductionStage.ALL_REDUCE and self._all_reduce is not None:
            self._all_reduce.wait()
            self._all_reduce = None
        if self.stage is not ReductionStage.DONE:
            if target.all_reduce_hook is not None:  # FSDP2's order: after the (HSDP) all-reduce, before dividing
                target.all_reduce_hook(self.contribution.reduced)
            write_grads(target, self.contribution)
            self.stage = ReductionStage.DONE
        return True

    def discard(self) -> None:
        """Wait for the collective in flight (every rank issued it) and drop the result."""
        for pending in (self._scatter.work if self._scatter else None, self._all_reduce):
            if pending is not None:
                pending.wait()
        self._scatter, self._all_reduce = None, None
        self.stage = ReductionStage.DONE


def divide_factors(reduce_dtype: torch.dtype, factor: float) -> tuple[float, float]:
    """The gradient divisions before and after the collectives, as FSDP2 makes them: in fp32 and bf16 all of
    ``factor`` after; in other dtypes (fp16) about sqrt(factor) before and the rest after, so that neither the
    sum over ranks overflows nor the divided gradients underflow."""
    if reduce_dtype in (torch.float32, torch.bfloat16):
        return 1.0, factor
    before = 1
    while factor % before == 0 and factor / before > before:
        before *= 2
    return float(before), factor / before


def write_grads(target: ReductionTarget, contribution: Contribution) -> None:
    """Sum partial model-parallel gradients, divide, and add each parameter's piece to its ``.grad``."""
    reduced, offsets = contribution.reduced, contribution.offsets
    reduce_partial_grads(reduced, list(contribution.partial_dims.values()), offsets, target.name)
    reduced.div_(target.divide_factor)
    reduced = reduced.to(target.orig_dtype)
    for param, _ in contribution.partial_dims.values():
        offset = offsets[id(param)]
        piece = reduced[offset : offset + param.padded_numel]
        if id(param) not in contribution.locally_used and not target.reduce_unused:
            if bool(piece.any()):
                raise RuntimeError(
                    f"{param.fqn} got no gradient on this rank but a gradient on another (an MoE expert no token "
                    "reached here, a branch taken elsewhere): call model.set_reduce_scatter_unused_params(True) "
                    "after fully_shard, so every rank receives the others' sum (as torch FSDP2 asks)"
                )
            continue  # no rank used it: None, as one process leaves it
        grad = param.sharded_grad(piece)
        sharded = param.sharded_param
        if sharded.grad is None:
            sharded.grad = grad
        else:
            sharded.grad += grad
        for hook in (getattr(sharded, "_post_accumulate_grad_hooks", None) or {}).values():
            hook(sharded)  # register_post_accumulate_grad_hook (an optimizer step in backward), as FSDP2 runs them


def reduce_partial_grads(
    reduced: torch.Tensor, params: list[tuple[ShardedParam, tuple[str, ...]]], offsets: dict[int, int], name: str
) -> None:
    """Sum gradients left partial by model parallelism over their group, one all-reduce per group."""
    by_group: dict[str, tuple[GroupInfo, list[ShardedParam]]] = {}
    for param, runtime_partial in params:
        for group in param.partial_groups(runtime_partial):
            by_group.setdefault(group.name, (group, []))[1].append(param)
    for group, members in by_group.values():
        segments = [reduced[offsets[id(p)] : offsets[id(p)] + p.padded_numel] for p in members]
        flat = torch.cat(segments)
        comm.all_reduce(flat, group, module=name)
        position = 0
        for segment in segments:
            segment.copy_(flat[position : position + segment.numel()])
            position += segment.numel()
        comm.release(flat)
