"""The parameters of one fully_shard unit and their bucketed communication.

One flat all-gather per unshard and one flat reduce-scatter (+ one all-reduce) per backward for the
whole unit, never one per parameter. Gradient routing follows GroupInfo (docs/design.md §3), not mesh type:

    shard_size > 1                   reduce-scatter on sharded_group_info, then all-reduce on
                                     unsharded_group_info when dp_size > 1 (HSDP)
    shard_size == 1, dp_size > 1     all-reduce on unsharded_group_info (pure-TP / DDP compat path)
    neither                          no communication

Gradients a model-parallel style left partial (pure-TP fix) are then summed over their TP/EP group,
and everything is divided by the data-parallel world so results equal one process on the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

import torch
from torch.distributed.tensor import DTensor

from hyper_parallel import comm, trace
from hyper_parallel.comm import GroupInfo
from hyper_parallel.fsdp.param import ShardedParam, placements_str, union_dims
from hyper_parallel.fsdp.reduction import GradientReduction


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``param_dtype``: all-gather and compute dtype; ``reduce_dtype``: gradient reduction dtype;
    ``output_dtype``: forward outputs are cast to it; ``cast_forward_inputs``: floating inputs are cast
    to ``param_dtype``. None keeps the parameter's own dtype."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True


class ShardedState(Enum):
    """Where a unit's parameters are: sharded (the module holds the sharded DTensors), an all-gather
    issued and not yet waited for (prefetch), or unsharded (the module computes with them)."""

    SHARDED = auto()
    GATHERING = auto()
    UNSHARDED = auto()


class ParamGroup:
    def __init__(
        self, name: str, params: list[ShardedParam], mp_policy: MixedPrecisionPolicy, device: torch.device
    ) -> None:
        self.name, self.params, self.mp_policy, self.device = name, params, mp_policy, device
        first = params[0]
        self.sharded_group: GroupInfo = first.sharded_group_info
        self.unsharded_group: GroupInfo = first.unsharded_group_info
        self.shard_size, self.dp_size, self.rank_size = first.shard_size, first.dp_size, first.rank_size
        self.orig_dtype = first.orig_dtype
        self.param_dtype = mp_policy.param_dtype or self.orig_dtype
        self.reduce_dtype = mp_policy.reduce_dtype or self.param_dtype
        self.gradient_divide_factor = float(self.rank_size)
        self.requires_gradient_sync = True
        self.requires_all_reduce = True
        self.partial_reduce: torch.Tensor | None = None  # reduce-scattered, not yet all-reduced (HSDP accumulation)
        self.partial_reduce_layout: dict[int, int] | None = None  # its offsets (trainable parameters then)
        self.partial_reduce_params: list[tuple[ShardedParam, tuple[str, ...]]] = []  # who contributed to it
        self.offsets = []
        total = 0
        for param in params:
            self.offsets.append(total)
            total += param.padded_numel
        self.total = total
        self.flat_shard = torch.empty(total, dtype=self.orig_dtype, device=device)
        for param, offset in zip(params, self.offsets):
            param.init_sharded(self.flat_shard[offset : offset + param.padded_numel])
        self.needs_all_gather = self.shard_size > 1
        alias = not self.needs_all_gather and self.param_dtype == self.orig_dtype
        for param, offset in zip(params, self.offsets):
            storage = self.flat_shard[offset : offset + param.padded_numel] if alias else None
            param.init_unsharded(self.param_dtype, device, storage)
        self.owns_unsharded_storage = not alias
        self.sharded_state = ShardedState.SHARDED
        self._gathering: tuple | None = None  # (pending all-gather, gathered buffer, cast shard) while GATHERING
        self.reduction: GradientReduction | None = None  # this unit's gradient reduction still in flight
        self.post_forward_group: GroupInfo | None = None  # reshard_after_forward=k: the k ranks kept between
        self.post_forward_shard: torch.Tensor | None = None  # this rank's rows of the gathered buffer, then

    # ----- forward -----
    @property
    def is_unsharded(self) -> bool:
        return self.sharded_state is ShardedState.UNSHARDED

    def unshard(self, async_op: bool = False, for_backward: bool = False) -> None:
        """All-gather the FSDP dim only: (Shard(a), <mp>) -> (Replicate(), <mp>). ``async_op`` issues the
        all-gather and returns (a prefetch); ``wait_for_unshard`` or a later ``unshard()`` completes it.
        Only a backward gathers from the shard kept after forward (reshard_after_forward=k): any other
        unshard reads the sharded parameters, which may have changed since (a load, an optimizer step)."""
        if not for_backward:
            self.post_forward_shard = None
        if self.sharded_state is ShardedState.SHARDED:
            self._issue_all_gather(async_op)
        if not async_op:
            self.wait_for_unshard()

    def _issue_all_gather(self, async_op: bool) -> None:
        pending, gathered, cast = None, None, None
        if self.needs_all_gather:
            gathered = torch.empty(self.shard_size, self.total, dtype=self.param_dtype, device=self.device)
            if self.post_forward_shard is not None:  # backward after reshard_after_forward=k: gather over k ranks
                shard, group = self.post_forward_shard.view(-1), self.post_forward_group
                self.post_forward_shard = None
            else:
                shard = self.flat_shard if self.param_dtype == self.orig_dtype else self.flat_shard.to(self.param_dtype)
                group = self.sharded_group
            cast = shard if shard is not self.flat_shard else None
            pending = comm.all_gather_into_tensor(gathered.view(-1), shard, group, module=self.name, async_op=async_op)
        self._gathering = (pending, gathered, cast)
        self.sharded_state = ShardedState.GATHERING

    def wait_for_unshard(self) -> None:
        """Complete an issued all-gather: wait, copy into the unsharded parameters, swap them in."""
        if self.sharded_state is not ShardedState.GATHERING:
            return
        pending, gathered, cast = self._gathering
        self._gathering = None
        if self.needs_all_gather:
            if pending is not None:
                pending.wait()
            for param, offset in zip(self.params, self.offsets):
                param.alloc_unsharded()
                param.copy_out(gathered[:, offset : offset + param.padded_numel])
            comm.release(gathered)
            if cast is not None:
                comm.release(cast)
        elif self.owns_unsharded_storage:
            for param, offset in zip(self.params, self.offsets):
                param.alloc_unsharded()
                param.copy_cast(self.flat_shard[offset : offset + param.padded_numel])
        for param in self.params:
            param.use_unsharded()
        self.sharded_state = ShardedState.UNSHARDED
        self._trace_placements(sharded_to_unsharded=True)

    def reshard(self, keep_post_forward_shard: bool = False) -> None:
        """Free the unsharded parameters; with ``keep_post_forward_shard`` (reshard_after_forward=k) keep the
        rows of the gathered buffer that this rank contributes when its group of k ranks gathers in backward."""
        if not keep_post_forward_shard:
            self.post_forward_shard = None
        self.wait_for_unshard()  # an all-gather in flight lands before its buffers are freed
        if not self.is_unsharded:
            return
        if keep_post_forward_shard and self.post_forward_group is not None:
            self.post_forward_shard = self._post_forward_rows()
        for param in self.params:
            if self.owns_unsharded_storage:
                param.free_unsharded()
            param.use_sharded()
        self.sharded_state = ShardedState.SHARDED
        self._trace_placements(sharded_to_unsharded=False)

    def _post_forward_rows(self) -> torch.Tensor:
        """Rows [s*m, (s+1)*m) of the [shard_size, total] all-gather buffer (s: this rank's place among its k
        ranks, m = shard_size / k): the k ranks' rows gathered in their order are the whole buffer again."""
        group = self.post_forward_group
        rows = self.shard_size // group.size
        first = group.index * rows
        kept = torch.empty(rows, self.total, dtype=self.param_dtype, device=self.device)
        for param, offset in zip(self.params, self.offsets):
            pieces = param.unsharded_padded.unflatten(param.fsdp_axis, (self.shard_size, param.chunk))
            kept[:, offset : offset + param.padded_numel].view(rows, *param.padded_shape).copy_(
                pieces.movedim(param.fsdp_axis, 0)[first : first + rows]
            )
        return kept

    def _trace_placements(self, sharded_to_unsharded: bool) -> None:
        if trace.current() is None:
            return
        for param in self.params:
            sharded, unsharded = placements_str(param.sharded_placements), placements_str(param.unsharded_placements)
            before, after = (sharded, unsharded) if sharded_to_unsharded else (unsharded, sharded)
            local = param.mp_local_shape if sharded_to_unsharded else tuple(param.sharded_param.to_local().shape)
            trace.placement(param.fqn, param.mesh_dims(), before, after, local, param.global_shape)

    # ----- backward -----
    def has_pending_grads(self) -> bool:
        """A gradient from this backward, one parked by an earlier micro-step (accumulation), or an HSDP
        partial reduction that is due now: a unit whose parameters were used only in earlier micro-steps
        must still deliver their gradients."""
        due = self.partial_reduce is not None and self.requires_all_reduce and self.requires_gradient_sync
        return due or any(p.unsharded_param.grad is not None or p.accumulated_grad is not None for p in self.params)

    def _collect_grads(self) -> list[tuple[ShardedParam, torch.Tensor, tuple[str, ...]]]:
        """(parameter, local unsharded gradient, dims it is still Partial on) for every parameter with a
        gradient from this backward or parked by an earlier micro-step without gradient sync: a parameter
        used only in earlier micro-steps keeps its gradient."""
        ready = []
        for param in self.params:
            grad = param.unsharded_param.grad
            partial: tuple[str, ...] = ()
            if grad is not None:
                param.unsharded_param.grad = None
                if isinstance(grad, DTensor):
                    grad, partial = param.local_grad(grad)
            if param.accumulated_grad is not None:
                parked, parked_partial = param.accumulated_grad, param.accumulated_partial
                grad = parked if grad is None else grad + parked
                partial = union_dims(partial, parked_partial)
                param.accumulated_grad, param.accumulated_partial = None, ()
            if grad is not None:
                ready.append((param, grad, partial))
        return ready

    def reduce_grads(self, async_op: bool = False) -> None:
        """Reduce the unsharded gradients into the sharded parameters' ``.grad``. With ``async_op`` the
        reduce-scatter is issued and left in flight (``self.reduction``); ``advance_reduction`` moves it on."""
        self.finish_reduction()  # the previous reduction into the same buffers lands first
        ready = self._collect_grads()
        if not self.requires_gradient_sync:
            for param, grad, partial in ready:
                param.accumulated_grad, param.accumulated_partial = grad, partial
            return
        offsets, total = self._reduce_layout(ready)
        if ready:
            reduced, reduced_params, pending = self._reduce_scatter(ready, offsets, total, async_op)
        elif self.partial_reduce is not None and self.requires_all_reduce:
            reduced, reduced_params, pending = torch.zeros(total, dtype=self.reduce_dtype, device=self.device), [], None
        else:
            return
        self.reduction = GradientReduction(self, reduced, reduced_params, offsets, pending, async_op)
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
        self.partial_reduce, self.partial_reduce_params, self.partial_reduce_layout = None, [], None
        for param in self.params:
            param.accumulated_grad, param.accumulated_partial = None, ()
            param.unsharded_param.grad = None

    def accumulate_partial(self, reduced: torch.Tensor, reduced_params: list, offsets: dict[int, int]) -> tuple:
        """HSDP accumulation: add the earlier micro-steps' partial reduction; with ``requires_all_reduce``
        False keep the sum for later and return None."""
        if self.partial_reduce is not None:
            if self.partial_reduce_layout != offsets:
                raise RuntimeError(
                    f"{self.name}: requires_grad of its parameters changed between micro-steps "
                    "of one gradient accumulation; freeze or unfreeze between optimizer steps"
                )
            reduced += self.partial_reduce
            reduced_params = self._merge(reduced_params, self.partial_reduce_params)
            self.partial_reduce, self.partial_reduce_params, self.partial_reduce_layout = None, [], None
        if not self.requires_all_reduce:
            self.partial_reduce, self.partial_reduce_params = reduced, reduced_params
            self.partial_reduce_layout = offsets
            return None
        return reduced, reduced_params

    def write_grads(self, reduced: torch.Tensor, reduced_params: list, offsets: dict[int, int]) -> None:
        """Sum partial model-parallel gradients, divide, and add each parameter's piece to its ``.grad``."""
        self._reduce_partial_grads(reduced, reduced_params, offsets)
        reduced.div_(self.gradient_divide_factor)
        reduced = reduced.to(self.orig_dtype)
        for param, _ in reduced_params:
            offset = offsets[id(param)]
            grad = param.sharded_grad(reduced[offset : offset + param.padded_numel])
            if param.sharded_param.grad is None:
                param.sharded_param.grad = grad
            else:
                param.sharded_param.grad += grad

    def _reduce_layout(self, ready: list) -> tuple[dict[int, int], int]:
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
        stray = [param.fqn for param, _, _ in ready if id(param) not in offsets]
        if stray:
            raise RuntimeError(
                f"{self.name}: {stray} got a gradient but no longer require one; change "
                "requires_grad between optimizer steps, not between forward and backward"
            )
        return offsets, total

    def _reduce_scatter(self, ready: list, offsets: dict[int, int], total: int, async_op: bool) -> tuple:
        """Copy the gradients into one flat [shard_size, total] buffer and reduce-scatter it: this rank's
        summed shard (the buffer itself when shard_size == 1), (param, partial dims) per gradient, and the
        reduce-scatter still in flight (None when done)."""
        reduce_in = (torch.empty if len(ready) == len(offsets) else torch.zeros)(
            self.shard_size, total, dtype=self.reduce_dtype, device=self.device
        )
        reduced_params = []
        while ready:  # pop: each unsharded gradient is freed once copied in, before the collective (peak memory)
            param, grad, partial = ready.pop()
            offset = offsets[id(param)]
            param.grad_into(grad.to(self.reduce_dtype), reduce_in[:, offset : offset + param.padded_numel])
            reduced_params.append((param, partial))
            del grad
        if self.shard_size == 1:
            return reduce_in.view(-1), reduced_params, None
        reduced = torch.empty(total, dtype=self.reduce_dtype, device=self.device)
        pending = comm.reduce_scatter_tensor(
            reduced, reduce_in.view(-1), self.sharded_group, module=self.name, async_op=async_op
        )
        if pending is None:
            comm.release(reduce_in)
            return reduced, reduced_params, None
        return reduced, reduced_params, (pending, reduce_in)

    @staticmethod
    def _merge(current: list, earlier: list) -> list:
        """(param, partial dims) of this micro-step and of the reduce-scattered ones before it (HSDP)."""
        merged = {id(param): (param, partial) for param, partial in earlier}
        for param, partial in current:
            before = merged.get(id(param), (param, ()))[1]
            merged[id(param)] = (param, union_dims(before, partial))
        return list(merged.values())

    def _reduce_partial_grads(self, reduced: torch.Tensor, ready: list, offsets: dict[int, int]) -> None:
        """Sum gradients left partial by model parallelism over their group, one all-reduce per group."""
        by_group: dict[str, tuple[GroupInfo, list[ShardedParam]]] = {}
        for param, runtime_partial in ready:
            for group in param.partial_groups(runtime_partial):
                by_group.setdefault(group.name, (group, []))[1].append(param)
        for group, params in by_group.values():
            segments = [reduced[offsets[id(p)] : offsets[id(p)] + p.padded_numel] for p in params]
            flat = torch.cat(segments)
            comm.all_reduce(flat, group, module=self.name)
            position = 0
            for segment in segments:
                segment.copy_(flat[position : position + segment.numel()])
                position += segment.numel()
            comm.release(flat)
