"""The parameters of one fully_shard unit: they are gathered and resharded here, reduced by
``reduction.GroupReducer``.

One flat all-gather per unshard for the whole unit, never one per parameter, over the dim the unit shards on
(``sharded_group``); with ``reshard_after_forward=k`` backward gathers the rows kept after forward over k ranks.

A unit holds one group per parameter dtype (a frozen bf16 base beside trainable fp32 adapters, as in
QLoRA): each group gathers in its own flat buffer, and only groups with trainable parameters reduce.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, NamedTuple

import torch

from hyper_parallel import comm, trace
from hyper_parallel.comm import GroupInfo, PendingCollective
from hyper_parallel.fsdp.extension import has_extension
from hyper_parallel.fsdp.gather import PackedRow, default_pieces, pack, piece_of, split_copy_out
from hyper_parallel.fsdp.param import ShardedParam, placements_str
from hyper_parallel.fsdp.reduction import GroupReducer

if TYPE_CHECKING:
    from hyper_parallel.fsdp.unit_mesh import UnitMesh


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``param_dtype``: all-gather and compute dtype; ``reduce_dtype``: gradient reduction dtype;
    ``output_dtype``: forward outputs are cast to it; ``cast_forward_inputs``: floating inputs are cast
    to ``param_dtype``. None keeps the parameter's own dtype."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True


class AllGatherInFlight(NamedTuple):
    """An all-gather issued and not yet copied out: its pending work (None when done at once), the buffer
    it fills ([ranks, row length]) and this rank's row with the layout of its pieces (None for both when
    nothing is gathered)."""

    work: PendingCollective | None
    gathered: torch.Tensor | None
    row: PackedRow | None


class ShardedState(Enum):
    """Where a unit's parameters are: sharded (the module holds the sharded DTensors), an all-gather
    issued and not yet waited for (prefetch), or unsharded (the module computes with them)."""

    SHARDED = auto()
    GATHERING = auto()
    UNSHARDED = auto()


SHARDED_STATE_NEXT = {
    ShardedState.SHARDED: ShardedState.GATHERING,  # an all-gather issued (unshard, or a prefetch)
    ShardedState.GATHERING: ShardedState.UNSHARDED,  # the all-gather waited for, the unsharded parameters in
    ShardedState.UNSHARDED: ShardedState.SHARDED,  # resharded
}
"""The cycle a group's parameters go through, the only moves ``ParamGroup._move_to`` allows."""


def _outside_functorch(method):
    """Run ``method`` with functorch's transforms off (FSDP2's ``_disable_functorch_if_active``): gathering and
    freeing parameters are bookkeeping a transform such as ``torch.func.jvp`` must not trace through."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        if torch._C._are_functorch_transforms_active():
            with torch._C._DisableFuncTorch():
                return method(*args, **kwargs)
        return method(*args, **kwargs)

    return wrapper


class ParamGroup:
    def __init__(
        self, name: str, params: list[ShardedParam], mp_policy: MixedPrecisionPolicy, unit_mesh: UnitMesh
    ) -> None:
        self.name, self.params, self.mp_policy = name, params, mp_policy
        first = params[0]
        self.sharded_group: GroupInfo = first.sharded_group_info
        self.shard_size = first.shard_size
        self.reducer = GroupReducer(name, params)  # the reduce path: settings, parked and partial sums, in flight
        self.offsets = []
        total = 0
        for param in params:
            self.offsets.append(total)
            total += param.padded_numel
        self.total = total
        self.needs_all_gather = self.shard_size > 1
        self._place(torch.device("meta") if first.is_meta else unit_mesh.device, first.orig_dtype)
        for param in params:
            param.init_sharded()
        self._init_unsharded()
        self.sharded_state = ShardedState.SHARDED
        self._gathering: AllGatherInFlight | None = None
        self.post_forward_group: GroupInfo | None = unit_mesh.post_forward_group  # reshard_after_forward=k's ranks
        self.post_forward_shard: torch.Tensor | None = None  # this rank's rows of them between forward and backward

    def _place(self, device: torch.device, orig_dtype: torch.dtype) -> None:
        """Where the group's buffers live and their dtypes (at construction, and after ``relink``), the reducer's
        too: reduce-scatters run in ``mp_policy.reduce_dtype``, else in the compute dtype."""
        self.device, self.orig_dtype = device, orig_dtype
        self.param_dtype = self.mp_policy.param_dtype or orig_dtype
        self.reducer.place(device, orig_dtype, self.mp_policy.reduce_dtype or self.param_dtype)

    def _init_unsharded(self) -> None:
        """The compute parameters: views of the padded shards when nothing is gathered or cast, else their own
        storage, allocated on unshard and freed on reshard."""
        alias = not self.needs_all_gather and self.param_dtype == self.orig_dtype
        for param in self.params:
            param.init_unsharded(self.param_dtype, self.device, param.padded_shard if alias else None)
        self.owns_unsharded_storage = not alias

    def rename(self, name: str) -> None:
        """The unit's name in the model, once the root's first forward knows it: the gather's and the
        reducer's collectives and errors carry it."""
        self.name = self.reducer.name = name

    # ----- the parameters the module holds -----
    def relink(self, strict: bool = True) -> None:
        """Take back the parameters the modules hold now, when something replaced or moved them: FSDP2's
        ``reset_sharded_param``, for ``to_empty`` / ``to`` (``nn.Module._apply``) and
        ``load_state_dict(assign=True)`` (meta-device initialisation, torchtune's state-dict broadcast).

        A registered parameter that is no longer a view of its padded shard has its data copied into a new padded
        shard on its device and keeps its identity; the compute parameters are rebuilt there. Cheap when nothing
        changed (one identity check per parameter), so every unshard calls it. ``strict`` False (from ``_apply``)
        leaves a group whose parameters are on several devices for the next call: the unit's other modules
        have not been moved yet."""
        if self.sharded_state is not ShardedState.SHARDED:
            return
        current = [param.registered() for param in self.params]
        if all(param.holds_own_shard(now) for param, now in zip(self.params, current)):
            return
        devices = {now._local_tensor.device for now in current}
        dtypes = {now._local_tensor.dtype for now in current}
        if len(devices) > 1 or len(dtypes) > 1:
            if not strict:  # a unit of several modules that nn.Module._apply has moved only in part so far
                return
            raise RuntimeError(
                f"{self.name}: the parameters of one fully_shard group are now on {sorted(map(str, devices))} "
                f"with dtypes {sorted(map(str, dtypes))}; move or cast the whole module at once "
                "(model.to_empty(device=...), model.to(dtype))"
            )
        self._place(devices.pop(), dtypes.pop())
        for param, now in zip(self.params, current):
            if not param.holds_own_shard(now):
                param.adopt(now)
            param.parked = None
        self._init_unsharded()

    @property
    def is_meta(self) -> bool:
        return self.params[0].padded_shard.is_meta

    def _move_to(self, state: ShardedState) -> None:
        """The one way ``sharded_state`` changes after construction, checked against ``SHARDED_STATE_NEXT``
        (as torch FSDP2's ``_assert_in_states``)."""
        if SHARDED_STATE_NEXT[self.sharded_state] is not state:
            raise RuntimeError(
                f"fully_shard unit {self.name!r}: its parameters cannot go from {self.sharded_state.name} to "
                f"{state.name} (only to {SHARDED_STATE_NEXT[self.sharded_state].name})"
            )
        self.sharded_state = state

    # ----- forward -----
    @property
    def is_unsharded(self) -> bool:
        return self.sharded_state is ShardedState.UNSHARDED

    @_outside_functorch
    def unshard(self, async_op: bool = False, for_backward: bool = False) -> None:
        """All-gather the FSDP dim only: (Shard(a), <mp>) -> (Replicate(), <mp>). ``async_op`` issues the
        all-gather and returns (a prefetch); ``wait_for_unshard`` or a later ``unshard()`` completes it.
        Only a backward gathers from the shard kept after forward (reshard_after_forward=k): any other
        unshard reads the sharded parameters, which may have changed since (a load, an optimizer step)."""
        if not for_backward:
            self.post_forward_shard = None
        if self.sharded_state is ShardedState.SHARDED:
            self.relink()
            if self.is_meta:
                raise RuntimeError(
                    "FSDP parameters should be materialized from meta device before training, but the following "
                    f"were still on meta device: {[param.fqn for param in self.params]} ({self.name}: built under "
                    "torch.device('meta')); materialise them before the first forward: model.to_empty(device=...), "
                    "then reset_parameters() / init_weights() or load a state dict"
                )
            self._issue_all_gather(async_op)
        if not async_op:
            self.wait_for_unshard()

    def _issue_all_gather(self, async_op: bool) -> None:
        """Copy the unit's pieces into one buffer (``hyper_parallel.fsdp.gather``) and all-gather it over the shard
        dim; backward after ``reshard_after_forward=k`` gathers the kept rows over k ranks. With nothing to gather
        (shard_size 1, no extension) the compute parameters alias or cast the shards (``wait_for_unshard``)."""
        work, gathered, row, group = None, None, None, self.sharded_group
        if self.needs_all_gather and self.post_forward_shard is not None:
            pieces = default_pieces(self.params, self.param_dtype)
            row, group = (
                PackedRow(self.post_forward_shard.view(-1), pieces, [None] * len(pieces)),
                self.post_forward_group,
            )
            self.post_forward_shard = None
        elif self.needs_all_gather or any(has_extension(p.local_shard, p.fqn) for p in self.params):
            row = pack(self.params, self.param_dtype, self.mp_policy, self.device)
        if row is not None and self.needs_all_gather:
            gathered = torch.empty(group.size * row.buffer.numel(), dtype=row.buffer.dtype, device=self.device)
            work = comm.all_gather_into_tensor(gathered, row.buffer, group, module=self.name, async_op=async_op)
            gathered = gathered.view(self.shard_size, -1)
        elif row is not None:
            gathered = row.buffer.view(1, -1)
        self._gathering = AllGatherInFlight(work, gathered, row)
        self._move_to(ShardedState.GATHERING)

    @_outside_functorch
    def wait_for_unshard(self) -> None:
        """Complete an issued all-gather: wait, copy into the unsharded parameters, swap them in."""
        if self.sharded_state is not ShardedState.GATHERING:
            return
        work, gathered, row = self._gathering
        self._gathering = None
        if row is not None:
            if work is not None:
                work.wait()
            if not split_copy_out(gathered, self.params, row):
                for param, pieces, metadata in zip(self.params, row.pieces, row.metadata):
                    rows = [piece_of(gathered, piece, row.is_bytes) for piece in pieces]
                    param.receive(rows, pieces, metadata, self.param_dtype)
            comm.release(gathered)
            comm.release(row.buffer)
        elif self.owns_unsharded_storage:
            for param in self.params:
                param.alloc_unsharded()
                param.copy_cast(param.padded_shard)
        for param in self.params:
            param.use_unsharded()
        self._move_to(ShardedState.UNSHARDED)
        self._trace_placements(sharded_to_unsharded=True)

    @_outside_functorch
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
            if self.owns_unsharded_storage or param.extension is not None:
                param.free_unsharded()
            param.use_sharded()
        self._move_to(ShardedState.SHARDED)
        self._trace_placements(sharded_to_unsharded=False)

    def _post_forward_rows(self) -> torch.Tensor:
        """Rows [s*m, (s+1)*m) of the [shard_size, total] all-gather buffer (s: this rank's place among its k
        ranks, m = shard_size / k): the k ranks' rows gathered in their order are the whole buffer again."""
        if any(param.extension is not None for param in self.params):
            raise NotImplementedError(
                f"{self.name}: reshard_after_forward={self.post_forward_group.size} (an int) with parameters that use "
                "the all-gather extension (fsdp_pre_all_gather); torch FSDP2 does not support it either: use True/False"
            )
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
            local = param.model_local_shape if sharded_to_unsharded else tuple(param.sharded_param.to_local().shape)
            trace.placement(param.fqn, param.mesh_dims(), before, after, local, param.global_shape)

    # ----- backward (the reduction itself: self.reducer) -----
    @property
    def has_trainable(self) -> bool:
        return any(param.trainable for param in self.params)
