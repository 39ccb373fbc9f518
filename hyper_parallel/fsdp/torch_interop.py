"""What torch's own code reads of an FSDP2 module's state, answered for ours.

torch's pipelining schedules turn gradient sync off for every microbatch's backward and then, once per
step, look up the stage's FSDP2 state with ``torch.distributed.fsdp.fully_shard.state(module)`` and call
``post_backward()`` on each of its parameter groups and ``_root_post_backward_final_callback()`` (stage.py,
``perform_reduce_grad``). ``register_with_torch`` files a small view of our state under that key, so the
schedules reduce our gradients once per step, as they do FSDP2's. ``FSDPModule._get_fsdp_state()`` returns
the same view, which is what torch's public helpers use: ``register_fsdp_forward_method`` runs a method
between the unit's forward hooks (``_pre_forward`` / ``_post_forward``), ``share_comm_ctx`` hands the units
one communication context (``_comm_ctx``; collectives here run on the default stream, so there is nothing
else to share). Anything else torch might ask of the view is an AttributeError with a message, not a wrong
answer.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import torch.nn as nn
from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY, RegistryItem
from torch.distributed.fsdp import fully_shard as torch_fully_shard

from hyper_parallel import trace

if TYPE_CHECKING:
    from hyper_parallel.fsdp.state import FullyShardState


class _GroupView:
    """``post_backward()``: reduce what this unit parked while gradient sync was off."""

    def __init__(self, state: FullyShardState) -> None:
        self._state = state
        self.comm_ctx = None  # set by share_comm_ctx

    def post_backward(self) -> None:
        state = self._state
        if any(group.reducer.has_pending_grads() for group in state.groups):
            trace.set_phase("backward")  # the step's gradient reduction, deferred past the last microbatch
            state._backward_done(backward_ran=False)


class _ContextView:
    def __init__(self, root: TorchStateView) -> None:
        self._root = root

    @property
    def all_states(self) -> list[TorchStateView]:
        """The units under the module this view was asked for (the pipeline stage's model chunk)."""
        module = self._root._state.modules[0]
        views = []
        for each in module.modules():
            view = getattr(each, "_hp_torch_view", None)
            if view is not None and all(view is not other for other in views):
                views.append(view)
        return views


class CommContext:
    """What ``share_comm_ctx`` hands every unit: FSDP2 shares its CUDA streams; collectives here are issued on
    the current stream, so units share them already and the context carries nothing."""


class TorchStateView:
    """The part of torch's ``FSDPState`` that torch.distributed.pipelining uses."""

    def __init__(self, state: FullyShardState) -> None:
        self._state = state
        self._fsdp_param_groups = [_GroupView(state)] if state.groups else []
        self._state_ctx = _ContextView(self)
        self._comm_ctx = CommContext()

    def _pre_forward(self, module: nn.Module, args, kwargs):
        return self._state._pre_forward(module, args, kwargs)

    def _post_forward(self, module: nn.Module, args, output):
        return self._state._post_forward(module, args, output)

    def _lazy_init(self) -> None:
        self._state._lazy_init()

    def _root_post_backward_final_callback(self) -> None:
        """Land the reductions in flight, reshard and reset, as at the end of an ordinary backward."""
        state = self._state
        if state.context is not None:
            state.context.root._end_of_backward()

    def __getattr__(self, name: str):
        raise AttributeError(
            f"torch asked hyper_parallel's fully_shard state for {name!r}, which only torch FSDP2 has: "
            "apply one fully_shard (ours or torch's) to the whole model"
        )


def register_with_torch(module: nn.Module, view: TorchStateView) -> None:
    """File ``view`` (one per unit) where ``torch.distributed.fsdp.fully_shard.state(module)`` and
    ``FSDPModule._get_fsdp_state()`` look."""
    module._hp_torch_view = view
    # torch's composable registry, where replicate() looks for modules fully_shard manages: it then leaves their
    # (sharded) parameters to the unit instead of turning them into local tensors for DDP
    module.__dict__.setdefault(REGISTRY_KEY, OrderedDict()).setdefault("fully_shard", RegistryItem())
    key = getattr(torch_fully_shard, "__wrapped__", None)
    if key is not None:
        module.__dict__.setdefault(STATE_KEY, {})[key] = view
