"""Gradient reduction of one fully_shard unit (``GroupReducer``, handed a group's parameters; param_group.py, which it
never imports, gathers and reshards): what it reduces, how sums carry across micro-steps, the reduction in flight.

One flat reduce-scatter (+ one all-reduce) per backward for the whole group, never one per parameter, routed by
GroupInfo sizes, not mesh type (the table of docs/design.md §3): reduce-scatter on the sharded group when
shard_size > 1, all-reduce on the unsharded (replica) group when dp_size > 1 (after it: HSDP; alone: pure TP,
DDP), nothing when both are 1. Gradients a model-parallel style left partial (pure-TP fix) are then summed
over their TP/EP group, and everything is divided by the data-parallel world so results equal one process on
the global batch.

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
    HSDP, all-reduce off   the reduce-scattered shard is kept (``HeldPartialSum``) and added to the next
                           micro-step's before its all-reduce

In flight (``GradientReduction``), with overlap the collectives are issued asynchronously and each stage is waited for
only when its result is needed: when the next unit starts its reduction (which moves every reduction in flight one
stage on) or at the end of backward (which finishes them all, before the optimizer reads ``.grad``). So while unit k's
reduce-scatter is on the wire, backward computes unit k-1. Without overlap every stage runs at once; either way the
same collectives reduce the same buffers in the same order, so the gradients are bit for bit the same.

    issued          reduce-scatter in flight (shard_size > 1)
    advance()       wait for it; HSDP: add the earlier micro-steps' partial sum, issue the all-reduce
    advance()       wait for the all-reduce; sum partial TP/EP gradients; divide; write ``.grad``
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, auto
from typing import NamedTuple

import torch
from torch.distributed.tensor import DTensor

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


class GroupReducer:
    """One parameter group's reduce path: its gradient settings (the ``FullyShardModule`` setters write them),
    what is parked while sync is off, the HSDP partial sum and the reduction in flight."""

    def __init__(self, name: str, params: list[ShardedParam]) -> None:
        first = params[0]
        self.name, self.params = name, params
        self.sharded_group, self.unsharded_group = first.sharded_group_info, first.unsharded_group_info
        self.shard_size, self.dp_size = first.shard_size, first.dp_size
        self.gradient_divide_factor = float(first.rank_size)
        self.requires_gradient_sync = True
        self.requires_all_reduce = True
        self.reduce_unused_params = False  # set_reduce_scatter_unused_params(True): zeros where no rank used one
        self.held = HeldPartialSum()  # HSDP: reduce-scattered, not yet all-reduced
        self.all_reduce_hook: Callable[[torch.Tensor], None] | None = None  # set_all_reduce_hook
        self.parked_since_sync = False  # a backward ran with gradient sync off: the next sync reduces it
        self.reduction: GradientReduction | None = None  # this group's gradient reduction still in flight
        self.device = self.orig_dtype = self.reduce_dtype = None  # set by ``place``, before any reduction

    def place(self, device: torch.device, orig_dtype: torch.dtype, reduce_dtype: torch.dtype) -> None:
        """Where the reduction buffers live and in which dtypes: the group's, when built and after a move or cast."""
        self.device, self.orig_dtype, self.reduce_dtype = device, orig_dtype, reduce_dtype

    def _collect_grads(self) -> dict[int, tuple[ShardedParam, torch.Tensor, tuple[str, ...]]]:
        """id(param) -> (parameter, local unsharded gradient, dims it is still Partial on) for every parameter
        with a gradient from this backward or parked by an earlier micro-step without gradient sync (in the
        reduce dtype, as FSDP2 accumulates): a parameter used only in earlier micro-steps keeps its gradient."""
        ready = {}
        for param in self.params:
            grad = param.unsharded_param.grad
            partial: tuple[str, ...] = ()
            if grad is not None:
                param.unsharded_param.grad = None
                if isinstance(grad, DTensor):
                    grad, partial = param.local_grad(grad)
            if param.parked is not None:
                parked = param.parked
                grad = parked.grad if grad is None else parked.grad + grad
                partial = union_dims(partial, parked.partial_dims)
                param.parked = None
            if grad is not None:
                ready[id(param)] = (param, grad, partial)
        return ready

    def reduce_grads(self, async_op: bool = False, backward_ran: bool = True) -> None:
        """Reduce the group's gradients into the sharded parameters' ``.grad`` (every trainable parameter is
        reduced, a zero contribution where this rank computed none: see the module's docstring). With
        ``async_op`` the reduce-scatter is issued and left in flight (``self.reduction``);
        ``advance_reduction`` moves it on. Without gradient sync the gradients are parked instead.

        Whether to communicate depends only on what every rank knows alike (this unit's backward ran, or
        one ran since the last sync), never on which gradients this rank happens to hold: so every rank
        issues the same collectives in the same order. ``backward_ran`` False with nothing parked: only an
        HSDP partial sum is due, and it is all-reduced without a reduce-scatter."""
        self.finish_reduction()  # the previous reduction into the same buffers lands first
        ready = self._collect_grads()
        if not self.requires_gradient_sync:
            for param, grad, partial in ready.values():
                param.parked = ParkedGradient(grad.to(self.reduce_dtype), partial)
            self.parked_since_sync = self.parked_since_sync or backward_ran
            return
        scatter_needed = backward_ran or self.parked_since_sync
        self.parked_since_sync = False
        offsets, total = self._reduce_layout(ready)
        if not offsets or not (scatter_needed or self.held.contribution is not None):
            return
        locally_used = set(ready)  # before _reduce_scatter empties ``ready``
        partial_dims = {}
        for param in self.params:
            if id(param) in offsets:
                partial_dims[id(param)] = (param, ready[id(param)][2] if id(param) in ready else ())
        if scatter_needed:
            reduced, scatter = self._reduce_scatter(ready, offsets, total, async_op)
        else:
            reduced, scatter = torch.zeros(total, dtype=self.reduce_dtype, device=self.device), None
        target = ReductionTarget(
            self.name,
            self.unsharded_group,
            self.dp_size,
            divide_factors(self.reduce_dtype, self.gradient_divide_factor)[1],
            self.orig_dtype,
            self.requires_all_reduce,
            self.reduce_unused_params,
            self.held,
            self.all_reduce_hook,
        )
        contribution = Contribution(reduced, offsets, partial_dims, locally_used)
        self.reduction = GradientReduction(target, contribution, scatter, async_op)
        if not async_op:
            self.finish_reduction()

    def advance_reduction(self) -> bool:
        """One stage of the reduction in flight (see ``GradientReduction``); True once none is left."""
        if self.reduction is not None and self.reduction.advance():
            self.reduction = None
        return self.reduction is None

    def finish_reduction(self) -> None:
        while not self.advance_reduction():
            pass

    def discard_gradients(self) -> None:
        """Drop this step's gradients (a failed iteration): land the reduction in flight without using it,
        and forget accumulated and partially reduced sums."""
        if self.reduction is not None:
            self.reduction.discard()
            self.reduction = None
        self.held.contribution = None
        self.parked_since_sync = False
        for param in self.params:
            param.parked = None
            param.unsharded_param.grad = None

    def _reduce_layout(self, ready: dict) -> tuple[dict[int, int], int]:
        """Offsets of the trainable parameters in the reduction buffer, and its length.

        Frozen parameters are gathered like the others but get no gradient, so they are left out of
        the reduce-scatter and all-reduce: the bytes on the wire are the trainable ones only. With
        every parameter trainable this is the flat shard's own layout.
        """
        offsets, total = {}, 0
        for param in self.params:
            if param.trainable:
                offsets[id(param)] = total
                total += param.padded_numel
        stray = [param.fqn for param, _, _ in ready.values() if id(param) not in offsets]
        if stray:
            raise RuntimeError(
                f"{self.name}: {stray} got a gradient but no longer require one; change "
                "requires_grad between optimizer steps, not between forward and backward"
            )
        return offsets, total

    def _reduce_scatter(self, ready: dict, offsets: dict[int, int], total: int, async_op: bool) -> tuple:
        """Copy the gradients into one flat [shard_size, total] buffer (zeros where this rank has none) and
        reduce-scatter it: this rank's summed shard (the buffer itself when shard_size == 1) and the
        reduce-scatter still in flight with its input buffer (None when done)."""
        reduce_in = (torch.empty if len(ready) == len(offsets) else torch.zeros)(
            self.shard_size, total, dtype=self.reduce_dtype, device=self.device
        )
        self._copy_in(ready, offsets, reduce_in)
        before, _ = divide_factors(self.reduce_dtype, self.gradient_divide_factor)
        if before != 1:
            reduce_in.div_(before)
        if self.shard_size == 1:
            return reduce_in.view(-1), None
        reduced = torch.empty(total, dtype=self.reduce_dtype, device=self.device)
        work = comm.reduce_scatter_tensor(
            reduced, reduce_in.view(-1), self.sharded_group, module=self.name, async_op=async_op
        )
        if work is None:
            comm.release(reduce_in)
            return reduced, None
        return reduced, ReduceScatterInFlight(work, reduce_in)

    def _copy_in(self, ready: dict, offsets: dict[int, int], reduce_in: torch.Tensor) -> None:
        """Each gradient into its columns of ``reduce_in`` ([shard_size, total], rank-major chunks, zero padded),
        emptying ``ready`` so that every unsharded gradient is freed before the collective. One chunked
        concatenation (FSDP2's ``_chunk_cat``, the same padding) when every trainable parameter has a gradient in
        the reduce dtype and is sharded on dim 0; otherwise one copy per parameter (``ShardedParam.grad_into``)."""
        entries = list(ready.values())
        if (
            list(ready) == list(offsets)
            and all(grad.dtype == self.reduce_dtype for _, grad, _ in entries)
            and all(param.fsdp_axis == 0 for param, _, _ in entries)
        ):
            ready.clear()
            torch._chunk_cat([grad for _, grad, _ in entries], 0, self.shard_size, out=reduce_in)
            return
        del entries
        for key in list(ready):
            param, grad, _ = ready.pop(key)
            offset = offsets[key]
            param.grad_into(grad.to(self.reduce_dtype), reduce_in[:, offset : offset + param.padded_numel])
            del grad

    def has_pending_grads(self) -> bool:
        """Gradients parked by an earlier micro-step, or an HSDP partial sum due now."""
        due = self.held.contribution is not None and self.requires_all_reduce and self.requires_gradient_sync
        return due or (self.parked_since_sync and self.requires_gradient_sync)


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
