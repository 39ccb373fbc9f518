"""Per-unit hooks that drive unshard / reshard / gradient reduction around forward and backward.

Timeline of one unit in a training step (as torch FSDP2):
  forward pre-hook   all-gather (unshard), swap in the unsharded parameters, prefetch the next units
  forward post-hook  reshard unless reshard_after_forward says otherwise (the root keeps its
                     parameters by default); hook the outputs
  output grad hook   (backward reaches this unit) all-gather again if resharded, prefetch
  grad-accumulated   when every trainable parameter of the unit has its gradient: reduce-scatter /
                     all-reduce, then reshard, unless the unit holds frozen parameters (below)
  end of backward    the root flushes units whose parameters got no gradient, resets for the next step

Frozen parameters get no gradient, so "every gradient has arrived" does not mean "backward is done
with this unit's weights": the input gradient of a frozen linear still needs its weight. A unit that
holds frozen parameters reshards only once the gradients of its forward inputs are computed (an
autograd function on the inputs, as FSDP2 does), or at the end of backward if no input needs one.

A unit may span several modules (``fully_shard([norm, output])``): it reshards after forward once
every one of them has run.
"""

from __future__ import annotations

import os
from enum import Enum, auto

import torch
import torch.nn as nn
from torch.autograd import Variable
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from hyper_parallel import trace
from hyper_parallel.fsdp.param_group import MixedPrecisionPolicy, ParamGroup


class TrainingState(Enum):
    """Where a unit is in the step; hooks check it, so a recomputed forward (activation checkpointing)
    inside backward does not reshard parameters that backward is using."""

    IDLE = auto()
    FORWARD = auto()
    PRE_BACKWARD = auto()  # backward has reached the unit: parameters unsharded for it
    POST_BACKWARD = auto()  # gradients reduced


class RunAfterInputGradients(torch.autograd.Function):
    """Identity on the unit's forward inputs; its backward runs once their gradients are computed,
    i.e. once backward is done with every weight of the unit, frozen ones included."""

    @staticmethod
    def forward(ctx, state: FullyShardState, *inputs: torch.Tensor):
        ctx.state = state
        return inputs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        ctx.state._after_input_gradients()
        return (None, *grads)


def overlap_default() -> bool:
    """Overlap communication with compute unless ``HYPER_PARALLEL_OVERLAP=0`` (or ``set_overlap(False)``)."""
    return os.environ.get("HYPER_PARALLEL_OVERLAP", "1") != "0"


class FullyShardState:
    def __init__(
        self,
        modules: list[nn.Module],
        group: ParamGroup | None,
        reshard_after_forward: bool | None,
        mp_policy: MixedPrecisionPolicy,
    ) -> None:
        self.modules = modules
        self.module = modules[0]
        self.group = group
        self.reshard_after_forward = reshard_after_forward  # None: True except for the root (FSDP2's default)
        self.reshard_after_backward = True
        self.mp_policy = mp_policy
        self.forward_prefetch: list[FullyShardState] | None = None  # explicit targets (set_modules_to_...)
        self.backward_prefetch: list[FullyShardState] | None = None  # None: implicit (backward only)
        self.overlap = overlap_default()
        self.implicit_forward_prefetch = False
        self.is_root: bool | None = None
        self.root: FullyShardState | None = None
        self.forward_order: list[FullyShardState] = []  # root only: units by pre-forward, first step
        self.post_forward_order: list[FullyShardState] = []  # root only: units by post-forward (backward reversed)
        self.order_recorded = False
        self.reductions_in_flight: list[ParamGroup] = []  # root only: async reductions, oldest first
        self.training_state = TrainingState.IDLE
        self.name = type(self.module).__name__
        self.parent_name = ""  # the enclosing unit's name: the trace label once this unit's backward is done
        self._outer_module_label = ""
        self.subtree: list[FullyShardState] = []
        self._modules_run: set[int] = set()
        self._grads_seen = 0
        self._expected_grads = 0
        self._has_frozen = False
        self._grads_reduced = False
        self._inputs_done = False
        self._input_hooks_pending = 0  # forward calls whose input gradients backward has not reached yet
        self._hooked: set[int] = set()
        self._callback_queued = False
        for module in modules:
            module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
            module.register_forward_hook(self._post_forward)

    @property
    def reshards_after_forward(self) -> bool:
        if self.reshard_after_forward is None:
            return not self.is_root
        return bool(self.reshard_after_forward)

    # ----- forward -----
    def _lazy_init(self) -> None:
        """The first unit whose forward runs with no initialised ancestor is the root of the tree."""
        if self.is_root is not None:
            return
        self.is_root = True
        self.subtree = []
        names: dict[FullyShardState, str] = {}
        module_names = {id(module): name for name, module in self.module.named_modules()}
        for name, module in self.module.named_modules():
            state = getattr(module, "_hp_state", None)
            if state is None or state in names:
                continue
            self.subtree.append(state)
            names[state] = name
            state.root = self
            if state is not self:
                state.is_root = False
            state.name = name or "root"
            if state.group is not None:
                state.group.name = state.name
                for param in state.group.params:  # names relative to the unit -> names in the model
                    owner, leaf = param.owners[0]
                    if id(owner) in module_names:
                        param.fqn = ".".join(part for part in (module_names[id(owner)], leaf) if part)
        for state, name in names.items():
            enclosing = [
                other
                for other, prefix in names.items()
                if other is not state and (prefix == "" or name.startswith(prefix + "."))
            ]
            if enclosing:
                state.parent_name = max(enclosing, key=lambda other: len(names[other])).name

    def _begin_step(self) -> None:
        """Read which parameters are trainable now (they may be frozen or unfrozen between steps). The
        counters of backward are reset when a backward ends, not here: a unit may run several forwards
        (a shared encoder) before one backward goes through all of them."""
        group = self.group
        if group is None:
            return
        for param in group.params:
            param.sync_requires_grad()
            if param.trainable and id(param) not in self._hooked:
                self._hooked.add(id(param))
                param.unsharded_param.register_post_accumulate_grad_hook(self._on_grad_accumulated)
        self._expected_grads = sum(param.trainable for param in group.params)
        self._has_frozen = self._expected_grads < len(group.params)

    def _reset_backward_counters(self) -> None:
        self._grads_seen, self._grads_reduced, self._inputs_done, self._input_hooks_pending = 0, False, False, 0

    def _pre_forward(self, module: nn.Module, args, kwargs):
        if self.training_state == TrainingState.PRE_BACKWARD:
            return args, kwargs  # recomputation inside backward: the parameters are already unsharded
        self._lazy_init()
        with trace.outside_compute(start_after=True if self.is_root else None):
            if self.is_root:
                if self._callback_queued:  # the previous backward raised before its end: recover first
                    self.reset_iteration()
                trace.set_phase("forward")
            if self.training_state != TrainingState.FORWARD:
                self._begin_step()
                self._modules_run.clear()
                self._record_order(self.root.forward_order if self.root is not None else None)
            self.training_state = TrainingState.FORWARD
            self._outer_module_label = trace.set_module(self.name)
            if self.group is not None:
                self.group.unshard()
            for state in self._forward_targets():
                state.prefetch()
        if self.mp_policy.param_dtype is not None and self.mp_policy.cast_forward_inputs:
            dtype = self.mp_policy.param_dtype
            cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
            args, kwargs = tree_map(cast, args), tree_map(cast, kwargs)
        if self._has_frozen and torch.is_grad_enabled():
            args, kwargs = self._hook_input_gradients(args, kwargs)
        return args, kwargs

    # ----- prefetch: at most one unit gathered ahead -----
    def _record_order(self, order: list[FullyShardState] | None) -> None:
        """Orders are recorded during the first training step and used from the second on (as FSDP2); not
        from a forward recomputed inside backward (reentrant checkpointing), whose order is backward's."""
        if (
            torch.is_grad_enabled()
            and order is not None
            and not self.root.order_recorded
            and self not in order
            and torch._C._current_graph_task_id() == -1
        ):
            order.append(self)

    def _neighbour(self, order: list[FullyShardState], step: int) -> list[FullyShardState]:
        if self.root is None or not self.root.order_recorded or self not in order:
            return []
        index = order.index(self) + step
        return [order[index]] if 0 <= index < len(order) else []

    def _forward_targets(self) -> list[FullyShardState]:
        """Explicit targets, else (opt-in) the unit whose forward comes next."""
        if self.forward_prefetch is not None:
            return self.forward_prefetch
        if self.root is not None and self.root.implicit_forward_prefetch:
            return self._neighbour(self.root.forward_order, 1)
        return []

    def _backward_targets(self) -> list[FullyShardState]:
        """Explicit targets, else (with overlap) the unit whose backward comes next: the one whose forward
        ended just before this one's."""
        if self.backward_prefetch is not None:
            return self.backward_prefetch
        return self._neighbour(self.root.post_forward_order, -1) if self.overlap and self.root is not None else []

    def prefetch(self, for_backward: bool = False) -> None:
        """Issue this unit's all-gather ahead of its use (asynchronous with overlap on)."""
        if self.group is not None:
            self.group.unshard(async_op=self.overlap, for_backward=for_backward)

    def _hook_input_gradients(self, args, kwargs):
        flat, spec = tree_flatten((args, kwargs))
        positions = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad]
        if positions:
            self._input_hooks_pending += 1
            hooked = RunAfterInputGradients.apply(self, *(flat[i] for i in positions))
            for position, tensor in zip(positions, hooked):
                flat[position] = tensor
        return tree_unflatten(flat, spec)

    def _post_forward(self, module: nn.Module, args, output):
        if self.training_state == TrainingState.PRE_BACKWARD:
            return output
        training = torch.is_grad_enabled()
        with trace.outside_compute():
            trace.set_module(self._outer_module_label)
            self._modules_run.add(id(module))
            if len(self._modules_run) == len(self.modules):
                self._record_order(self.root.post_forward_order if self.root is not None else None)
                if self.group is not None and (not training or self.reshards_after_forward):
                    self.group.reshard(keep_post_forward_shard=training)
                self.training_state = TrainingState.IDLE
        if self.mp_policy.output_dtype is not None:
            dtype = self.mp_policy.output_dtype
            output = tree_map(
                lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, output
            )
        if training:
            for tensor in tree_flatten(output)[0]:
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(self._pre_backward)
        return output

    # ----- backward -----
    def _pre_backward(self, grad):
        if self.training_state in (TrainingState.PRE_BACKWARD, TrainingState.POST_BACKWARD):
            return grad
        self.training_state = TrainingState.PRE_BACKWARD
        with trace.outside_compute():
            root = self.root if self.root is not None else self
            if not root._callback_queued:  # from any unit: the loss may not use the root's output
                root._callback_queued = True
                trace.set_phase("backward")
                Variable._execution_engine.queue_callback(root._end_of_backward)
            trace.set_module(self.name)
            if self.group is not None:
                self.group.unshard(for_backward=True)
            for state in self._backward_targets():
                state.prefetch(for_backward=True)
        return grad

    def _on_grad_accumulated(self, _param) -> None:
        self._grads_seen += 1
        if self._grads_seen == self._expected_grads:
            self._grads_seen = 0
            with trace.outside_compute():
                self._reduce()
                if not self._has_frozen or self._inputs_done:
                    self._reshard_after_backward()

    def _after_input_gradients(self) -> None:
        """Backward reached the inputs of one forward call; once it reached those of every call, no
        backward node of this unit (frozen weights included) is left to run."""
        self._input_hooks_pending = max(0, self._input_hooks_pending - 1)
        self._inputs_done = self._input_hooks_pending == 0
        if self._inputs_done and (self._grads_reduced or self._expected_grads == 0):
            with trace.outside_compute():
                self._reshard_after_backward()

    def _reduce(self) -> None:
        """Start this unit's gradient reduction. With overlap, the reductions already in flight move one
        stage on first (their reduce-scatters are waited for and their all-reduces issued), then this
        unit's reduce-scatter is issued and left in flight behind the next unit's backward."""
        root = self.root if self.root is not None else self
        if self.overlap:
            root.reductions_in_flight = [group for group in root.reductions_in_flight if not group.advance_reduction()]
        self.group.reduce_grads(async_op=self.overlap)
        if self.group.reduction is not None:
            root.reductions_in_flight.append(self.group)
        self._grads_reduced = True
        self.training_state = TrainingState.POST_BACKWARD

    def _reshard_after_backward(self) -> None:
        if self.reshard_after_backward:
            self.group.reshard()
        trace.set_module(self.parent_name)

    def _end_of_backward(self) -> None:
        with trace.outside_compute(start_after=False):
            for state in self.subtree:
                if state.group is not None and state.group.has_pending_grads():
                    state._reduce()
            for group in self.reductions_in_flight:  # every gradient is written before the optimizer runs
                group.finish_reduction()
            self.reductions_in_flight = []
            for state in self.subtree:
                if state.group is not None:
                    state.group.wait_for_unshard()  # a prefetch in flight must land before the optimizer
                    if state.reshard_after_backward:
                        state.group.reshard()
                state._reset_backward_counters()
                state.training_state = TrainingState.IDLE
            self._callback_queued = False
            self.order_recorded = True
            trace.set_phase("other")
            trace.set_module("")

    def reset_iteration(self) -> None:
        """After a forward or backward that raised (FSDP2's ``reset_iter_state``): land every collective in
        flight (every rank issued them, so every rank waits for them), drop the step's gradients still being
        reduced, reshard, and reset every unit for the next step."""
        self.reductions_in_flight = []
        for state in self.subtree or [self]:
            if state.group is not None:
                state.group.discard_gradients()
                state.group.reshard()
            state._reset_backward_counters()
            state.training_state = TrainingState.IDLE
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
