"""Per-module hooks that drive unshard / reshard / gradient reduction around forward and backward.

Timeline of one unit in a training step (as torch FSDP2):
  forward pre-hook   all-gather (unshard), swap in the unsharded parameters, prefetch the next units
  forward post-hook  reshard unless this is the root or reshard_after_forward is False; hook the outputs
  output grad hook   (backward reaches this unit) all-gather again if resharded, prefetch
  grad-accumulated   when every parameter of the unit has its gradient: reduce-scatter / all-reduce, reshard
  end of backward    the root flushes units whose parameters got no gradient, resets for the next step
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.autograd import Variable
from torch.utils._pytree import tree_flatten, tree_map

from hyper_parallel import trace
from hyper_parallel.fsdp.param_group import MixedPrecisionPolicy, ParamGroup


class FullyShardState:
    def __init__(self, module: nn.Module, group: ParamGroup | None, reshard_after_forward: bool,
                 mp_policy: MixedPrecisionPolicy) -> None:
        self.module = module
        self.group = group
        self.reshard_after_forward = reshard_after_forward
        self.mp_policy = mp_policy
        self.forward_prefetch: list[FullyShardState] = []
        self.backward_prefetch: list[FullyShardState] = []
        self.is_root: bool | None = None
        self.name = type(module).__name__
        self.parent_name = ""  # the enclosing unit's name: the trace label once this unit's backward is done
        self._outer_module_label = ""
        self.subtree: list[FullyShardState] = []
        self._grads_seen = 0
        self._pre_backward_done = False
        self._callback_queued = False
        self._hook_handles = []
        if group is not None:
            for param in group.params:
                if param.requires_grad:
                    self._hook_handles.append(
                        param.unsharded_param.register_post_accumulate_grad_hook(self._on_grad_accumulated))
        self._expected_grads = sum(p.requires_grad for p in group.params) if group else 0
        module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        module.register_forward_hook(self._post_forward)

    # ----- forward -----
    def _lazy_init(self) -> None:
        """The first unit whose forward runs with no initialised ancestor is the root of the tree."""
        if self.is_root is not None:
            return
        self.is_root = True
        self.subtree = []
        names = {}
        for name, module in self.module.named_modules():
            state = getattr(module, "_hp_state", None)
            if state is None:
                continue
            self.subtree.append(state)
            names[state] = name
            if state is not self:
                state.is_root = False
            state.name = name or "root"
            if state.group is not None:
                state.group.name = state.name
                for param in state.group.params:  # names relative to the unit -> names in the model
                    param.fqn = f"{name}.{param.fqn}" if name else param.fqn
        for state, name in names.items():
            enclosing = [other for other, prefix in names.items()
                         if other is not state and (prefix == "" or name.startswith(prefix + "."))]
            if enclosing:
                state.parent_name = max(enclosing, key=lambda other: len(names[other])).name

    def _pre_forward(self, module: nn.Module, args, kwargs):
        self._lazy_init()
        if self.is_root:
            trace.set_phase("forward")
        self._outer_module_label = trace.set_module(self.name)
        if self.group is not None:
            self.group.unshard()
        for state in self.forward_prefetch:
            state.unshard()
        if self.mp_policy.param_dtype is not None and self.mp_policy.cast_forward_inputs:
            dtype = self.mp_policy.param_dtype
            cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
            args, kwargs = tree_map(cast, args), tree_map(cast, kwargs)
        return args, kwargs

    def _post_forward(self, module: nn.Module, args, output):
        training = torch.is_grad_enabled()
        trace.set_module(self._outer_module_label)
        if self.group is not None and (not training or (self.reshard_after_forward and not self.is_root)):
            self.group.reshard()
        if self.mp_policy.output_dtype is not None:
            dtype = self.mp_policy.output_dtype
            output = tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                              output)
        if training:
            for tensor in tree_flatten(output)[0]:
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(self._pre_backward)
        return output

    # ----- backward -----
    def _pre_backward(self, grad):
        if self._pre_backward_done:
            return grad
        self._pre_backward_done = True
        root = self if self.is_root else None
        if root is not None and not self._callback_queued:
            self._callback_queued = True
            trace.set_phase("backward")
            Variable._execution_engine.queue_callback(self._end_of_backward)
        trace.set_module(self.name)
        if self.group is not None:
            self.group.unshard()
        for state in self.backward_prefetch:
            state.unshard()
        return grad

    def _on_grad_accumulated(self, _param) -> None:
        self._grads_seen += 1
        if self._grads_seen == self._expected_grads:
            self._reduce_and_reshard()

    def _reduce_and_reshard(self) -> None:
        self.group.reduce_grads()
        self.group.reshard()
        self._grads_seen = 0
        trace.set_module(self.parent_name)

    def _end_of_backward(self) -> None:
        for state in self.subtree:
            if state.group is not None:
                if state.group.has_pending_grads():
                    state._reduce_and_reshard()
                state.group.reshard()
            state._grads_seen = 0
            state._pre_backward_done = False
        self._callback_queued = False
        trace.set_phase("other")
        trace.set_module("")

    # ----- explicit control -----
    def unshard(self) -> None:
        if self.group is not None:
            self.group.unshard()

    def reshard(self) -> None:
        if self.group is not None:
            self.group.reshard()
