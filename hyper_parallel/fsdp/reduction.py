"""One unit's gradient reduction, in flight: reduce-scatter, then (HSDP) all-reduce, then the gradients.

With overlap the collectives are issued asynchronously and each stage is waited for only when its
result is needed: when the next unit starts its reduction (which moves every reduction in flight one
stage on) or at the end of backward (which finishes them all, before the optimizer reads ``.grad``).
So while unit k's reduce-scatter is on the wire, backward computes unit k-1, as in torch FSDP2.

    issued          reduce-scatter in flight (shard_size > 1)
    advance()       wait for it; HSDP: add the earlier micro-steps' partial sum, issue the all-reduce
    advance()       wait for the all-reduce; sum partial TP/EP gradients; divide; write ``.grad``

Without overlap every stage runs at once. Either way the same collectives reduce the same buffers in
the same order, so the gradients are bit for bit the same.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import Protocol

import torch

from hyper_parallel import comm


class ReducingGroup(Protocol):
    """What a reduction needs of its unit (a ``ParamGroup``), so this module does not import it back."""

    name: str
    dp_size: int
    unsharded_group: comm.GroupInfo

    def accumulate_partial(self, reduced: torch.Tensor, reduced_params: list, offsets: dict[int, int]) -> tuple: ...

    def write_grads(self, reduced: torch.Tensor, reduced_params: list, offsets: dict[int, int]) -> None: ...


class ReductionStage(Enum):
    REDUCE_SCATTER = auto()  # issued; its result (this rank's summed shard) not yet waited for
    ALL_REDUCE = auto()  # HSDP: the reduce-scatter's result being summed over the replicas


class GradientReduction:
    def __init__(
        self,
        group: ReducingGroup,
        reduced: torch.Tensor,
        reduced_params: list,
        offsets: dict[int, int],
        scatter: tuple | None,
        async_op: bool,
    ) -> None:
        self.group, self.reduced, self.reduced_params, self.offsets = group, reduced, reduced_params, offsets
        self.async_op = async_op
        self.stage = ReductionStage.REDUCE_SCATTER
        self._pending = scatter  # (pending reduce-scatter, its input buffer) or None when already done

    def advance(self) -> bool:
        """Wait for the stage in flight and start the next; True when the gradients are written."""
        group = self.group
        if self.stage is ReductionStage.REDUCE_SCATTER:
            if self._pending is not None:
                pending, reduce_in = self._pending
                pending.wait()
                comm.release(reduce_in)
                self._pending = None
            if group.dp_size > 1:
                kept = group.accumulate_partial(self.reduced, self.reduced_params, self.offsets)
                if kept is None:
                    return True  # HSDP accumulation without all-reduce: the partial sum waits for a later step
                self.reduced, self.reduced_params = kept
                if self.async_op:
                    self._pending = comm.all_reduce(
                        self.reduced, group.unsharded_group, module=group.name, async_op=True
                    )
                    self.stage = ReductionStage.ALL_REDUCE
                    return False
                comm.all_reduce(self.reduced, group.unsharded_group, module=group.name)
        elif self._pending is not None:
            self._pending.wait()
            self._pending = None
        group.write_grads(self.reduced, self.reduced_params, self.offsets)
        return True

    def discard(self) -> None:
        """Wait for the collective in flight (every rank issued it) and drop the result."""
        if self._pending is not None:
            pending = self._pending[0] if isinstance(self._pending, tuple) else self._pending
            pending.wait()
            self._pending = None
