"""The methods ``fully_shard`` adds to a module: torch FSDP2's ``FSDPModule`` surface, plus ``sync_weights``.

``FullyShardModule`` subclasses torch's ``FSDPModule``, so torch's consumers treat ours as FSDP2
(pipelining's schedules, torchtitan's helpers): every method of ``FSDPModule`` is defined here, and what
FSDP2 offers and this implementation does not is refused by name (``NotImplementedError``), so a
training loop written for FSDP2 never silently does something else.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from hyper_parallel import comm
from hyper_parallel.fsdp.param import ShardedParam
from hyper_parallel.fsdp.state import FullyShardState

UNSUPPORTED_FSDP2_METHODS = {
    "set_custom_all_gather": "custom all-gather implementations",
    "set_custom_reduce_scatter": "custom reduce-scatter implementations",
    "set_force_sum_reduction_for_comms": "forced SUM reductions",
    "set_separate_reduce_scatter_group": "a separate reduce-scatter process group",
    "set_unshard_in_backward": "skipping the backward all-gather",
    "set_allocate_memory_from_process_group_for_comm": "process-group memory allocation",
    "set_symm_mem_for_comm": "symmetric memory",
}


class DeepcopyRefused(RuntimeError, AssertionError):
    """``copy.deepcopy`` of a sharded module: an ``AssertionError``, as torch FSDP2 raises it, and a
    ``RuntimeError``."""


class UnshardHandle:
    """What ``unshard(async_op=True)`` returns. The all-gather has completed when ``unshard`` returns
    (collectives are issued synchronously here), so ``wait()`` only marks the handle as waited for."""

    def __init__(self) -> None:
        self.waited = False

    def wait(self) -> None:
        self.waited = True


def _refusal(name: str, what: str):
    def refuse(self, *args, **kwargs):
        raise NotImplementedError(f"{name} (torch FSDP2: {what}) is not supported by hyper_parallel's fully_shard")

    refuse.__name__ = name
    refuse.__doc__ = f"Refused: {what} are not offered by this implementation."
    return refuse


def _on_stream(hook: Callable[[torch.Tensor], None], stream, device: torch.device) -> Callable[[torch.Tensor], None]:
    """``hook`` run with ``stream`` current on the unit's device (``set_all_reduce_hook(..., stream=)``)."""

    def run(reduced: torch.Tensor) -> None:
        with torch.get_device_module(device).stream(stream):
            hook(reduced)

    return run


class FullyShardModule(FSDPModule):
    """Methods added to a module by ``fully_shard`` (its class becomes a subclass of this and its own)."""

    _hp_state: FullyShardState
    _orig_cls_mro_index = 3  # [FullyShard<Orig>, FullyShardModule, FSDPModule, Orig, ...]: FSDPModule.__new__

    def _states(self, recurse: bool) -> list[FullyShardState]:
        if not recurse:
            return [self._hp_state]
        states = []
        for module in self.modules():
            state = getattr(module, "_hp_state", None)
            if state is not None and state not in states:
                states.append(state)
        return states

    def __deepcopy__(self, memo):
        raise DeepcopyRefused(
            f"FSDP does not support deepcopy (torch FSDP2's words): copy.deepcopy of a fully_shard module "
            f"({type(self).__name__}) is not supported: deepcopy the model before fully_shard, or save and load a "
            "state dict"
        )

    def _get_fsdp_state(self):
        """The view of this unit torch's FSDP2 helpers read (``hyper_parallel.fsdp.torch_interop``)."""
        return self._hp_torch_view

    def _apply(self, *args, **kwargs):
        """``to_empty`` / ``to`` / ``cuda``: move the sharded parameters, then relink each group's flat shard
        and compute parameters to them (FSDP2's ``_apply`` + ``reset_sharded_param``)."""
        self._hp_state.reshard()
        result = super(FSDPModule, self)._apply(*args, **kwargs)  # nn.Module's: FSDPModule's reads FSDP2 state
        with torch.no_grad():
            for group in self._hp_state.groups:
                group.relink(strict=False)
        return result

    def unshard(self, async_op: bool = False) -> UnshardHandle | None:
        """All-gather this unit's parameters now (only the FSDP dim; TP/EP placements stay)."""
        self._hp_state.unshard()
        return UnshardHandle() if async_op else None

    def set_post_optim_event(self, event) -> None:
        """FSDP2 lets the next all-gather wait on ``event`` (recorded after the optimizer step) instead of on
        the whole current stream. Ours issues every all-gather from the current stream, so it already runs
        after the optimizer's work; the current stream waits on the event here, which is all that is left
        of it. ``None`` (what a CPU stream's ``record_event`` gives) is accepted, as FSDP2 accepts it."""
        if event is not None:
            event.wait()

    def reshard(self) -> None:
        """Free the unsharded parameters; the module holds its sharded DTensors again."""
        self._hp_state.reshard()

    def reset_iter_state(self) -> None:
        """On the root, after a forward or backward that raised: discard the failed step's gradients and
        collectives in flight and make every unit ready for the next step (FSDP2's method of that name).
        The next forward does this by itself when a backward did not finish."""
        state = self._hp_state
        (state.context.root if state.context is not None else state).reset_iteration()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """False: skip reduce-scatter and all-reduce, accumulate unsharded gradients locally in the reduce
        dtype (gradient accumulation); the next backward with True reduces the accumulated sum."""
        for state in self._states(recurse):
            for group in state.groups:
                group.reducer.requires_gradient_sync = bool(requires_gradient_sync)

    def set_all_reduce_hook(self, hook: Callable[[torch.Tensor], None], *, stream=None) -> None:
        """``hook(reduced)`` runs on this unit's reduced gradient shard (this rank's flat buffer, in the reduce
        dtype, before the division), after the reduce-scatter, and after the all-reduce under HSDP; what it
        writes into the buffer becomes the gradients (a custom all-reduce over replicas, as FSDP2 offers).
        ``stream``: the hook runs with it current; refused under HSDP, as FSDP2 refuses it."""
        for group in self._hp_state.groups:
            if stream is not None and group.reducer.dp_size > 1:
                raise ValueError("stream cannot be set when using native HSDP")
            group.reducer.all_reduce_hook = hook if stream is None else _on_stream(hook, stream, group.reducer.device)

    def set_requires_all_reduce(self, requires_all_reduce: bool, *, recurse: bool = True) -> None:
        """False (HSDP): reduce-scatter but keep the result partial over the replicate group; the next
        backward with True all-reduces the sum."""
        for state in self._states(recurse):
            for group in state.groups:
                group.reducer.requires_all_reduce = bool(requires_all_reduce)

    def set_reduce_scatter_unused_params(self, reduce_scatter_unused_params: bool, *, recurse: bool = True) -> None:
        """True (MoE, branches taken on some ranks): every trainable parameter gets the reduced gradient, the
        others' sum where this rank computed none, zeros where no rank did (as FSDP2). False (the default): a
        parameter gets a gradient where this rank computed one, ``None`` where no rank did (one process's
        answer); one used on other ranks only is refused with this fix. Every rank reduces the same buffer
        either way (see ``hyper_parallel.fsdp.reduction``)."""
        for state in self._states(recurse):
            for group in state.groups:
                group.reducer.reduce_unused_params = bool(reduce_scatter_unused_params)

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"set_reshard_after_forward takes a bool, got {reshard_after_forward!r}")
        for state in self._states(recurse):
            state.settings.reshard_after_forward = reshard_after_forward
            for group in state.groups:  # a bool replaces an int given to fully_shard: no smaller group any more
                group.post_forward_group, group.post_forward_shard = None, None

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """False: keep the unsharded parameters after backward, so the next forward gathers nothing
        (gradient accumulation; as in FSDP2, an optimizer step in between is not seen by them)."""
        for state in self._states(recurse):
            state.settings.reshard_after_backward = bool(reshard_after_backward)

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """Accepted for FSDP2 compatibility, and nothing to do: every reduction in flight is finished at the
        end of its own backward, so there is nothing to wait for after the last one."""

    def set_gradient_divide_factor(self, factor: float) -> None:
        """Divide this unit's reduced gradients by ``factor`` instead of the data-parallel world (rank_size).
        As in FSDP2, only this unit's own parameters: nested units keep theirs (call it on each)."""
        if factor <= 0:
            raise ValueError(f"gradient divide factor must be > 0, got {factor}")
        for group in self._hp_state.groups:
            group.reducer.gradient_divide_factor = float(factor)

    def set_reduce_scatter_divide_factor(self, factor: float) -> None:
        """FSDP2's older name of ``set_gradient_divide_factor``."""
        self.set_gradient_divide_factor(factor)

    def set_reduce_scatter_max_input_buffers(self, max_input_buffers: int, *, recurse: bool = True) -> None:
        """FSDP2's cap on reduce-scatter input buffers in flight, a scheduling dial that leaves the numbers
        unchanged: validated as FSDP2 validates it and accepted. Ours keeps no pool of such buffers (each
        reduction's input lives until its collective is waited for), so there is nothing to cap."""
        if isinstance(max_input_buffers, bool) or not isinstance(max_input_buffers, int):
            raise TypeError(f"max_input_buffers must be an int, got {type(max_input_buffers).__name__}")
        if max_input_buffers < 1:
            raise ValueError(f"max_input_buffers must be a positive int, got {max_input_buffers}")

    def set_modules_to_forward_prefetch(self, modules: list[nn.Module]) -> None:
        """All-gather these units' parameters at the start of this unit's forward."""
        self._hp_state.settings.forward_prefetch = [state_of(m) for m in modules]

    def set_modules_to_backward_prefetch(self, modules: list[nn.Module]) -> None:
        """All-gather these units' parameters when backward reaches this unit."""
        self._hp_state.settings.backward_prefetch = [state_of(m) for m in modules]

    def set_overlap(self, overlap: bool, *, recurse: bool = True) -> None:
        """True (the default, unless ``HYPER_PARALLEL_OVERLAP=0``): prefetch the next unit's all-gather in
        backward and leave reduce-scatters / all-reduces in flight until their result is needed. False:
        every collective is issued and waited for on the spot. The numbers are the same either way."""
        for state in self._states(recurse):
            state.settings.overlap = bool(overlap)

    def set_implicit_forward_prefetch(self, enabled: bool) -> None:
        """On the root: from the second step on, issue the next unit's all-gather when a unit's forward
        begins (order of the first step), so it travels while this unit computes (one unit ahead)."""
        self._hp_state.settings.implicit_forward_prefetch = bool(enabled)

    def _set_unshard_async_op(self, async_op: bool) -> None:
        """Accepted for FSDP2 compatibility: prefetches are asynchronous with overlap on, the rest is not."""

    def sharded_params(self) -> list[ShardedParam]:
        """This unit's managed parameters (not those of nested fully_shard units)."""
        return [param for group in self._hp_state.groups for param in group.params]

    def sync_weights(self) -> None:
        """Compat mode: make every replica's weights equal, on explicit request only.

        Broadcasts each unit's sharded parameters from the first rank of the unsharded dp group, and
        parameters with partial gradients from the first rank of their model-parallel group."""
        for group in (group for state in self._states(recurse=True) for group in state.groups):
            group.relink()
            with torch.no_grad():
                shards = [param.padded_shard.view(-1) for param in group.params]
                flat = torch.cat(shards)
                comm.broadcast(flat, group.params[0].unsharded_group_info, module=group.name)
                for shard, piece in zip(shards, flat.split([shard.numel() for shard in shards])):
                    shard.copy_(piece)
                for param in group.params:
                    for model_group in param.partial_groups():
                        comm.broadcast(param.sharded_param.to_local(), model_group, module=group.name)


for _name, _what in UNSUPPORTED_FSDP2_METHODS.items():
    setattr(FullyShardModule, _name, _refusal(_name, _what))


def state_of(module: nn.Module) -> FullyShardState:
    if not isinstance(module, FullyShardModule):
        raise ValueError(f"{type(module).__name__} is not managed by fully_shard; apply fully_shard to it first")
    return module._hp_state
