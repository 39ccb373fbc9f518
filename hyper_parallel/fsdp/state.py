"""Per-unit hooks that drive unshard / reshard / gradient reduction around forward and backward.

Timeline of one unit in a training step (as torch FSDP2):
  forward pre-hook   all-gather (unshard), swap in the unsharded parameters, prefetch the next units;
                     wrap the inputs so backward reports when their gradients are computed
  forward post-hook  reshard unless reshard_after_forward says otherwise (the root keeps its
                     parameters by default); hook the outputs
  output grad hook   (backward reaches this unit) all-gather again if resharded, prefetch
  input gradients    (backward is done with the unit, ``BackwardProgress``) reduce-scatter / all-reduce,
                     then reshard
  end of backward    the root reduces units backward did not finish (the embedding, whose inputs need
                     no gradient), lands every reduction in flight, resets for the next step

A unit may span several modules (``fully_shard([norm, output])``): it reshards after forward once
every one of them has run. Every change of ``training_state`` goes through ``_transition``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
from torch.autograd import Variable

from hyper_parallel import trace
from hyper_parallel.fsdp.param_group import MixedPrecisionPolicy, ParamGroup
from hyper_parallel.fsdp.reduction import GroupReducer
from hyper_parallel.fsdp.step import (
    FORWARD,
    IDLE,
    POST_BACKWARD,
    PRE_BACKWARD,
    BackwardProgress,
    TrainingState,
    check_transition,
)
from hyper_parallel.fsdp.unit_io import cast_floating, hook_inputs, hook_outputs


def _not_traced(hook):
    """Keep ``torch.compile`` out of a hook, in both ways a hook meets it, without importing dynamo (0.45 s of
    every rank's start):

    * called as a frame of its own (a block compiled with ``block.compile(fullgraph=True)`` before fully_shard,
      torchtitan's ``apply_compile``: the eager ``_call_impl`` runs the hooks around the compiled forward): the
      wrapper's code is marked to run, with all it calls, untraced, as FSDP2's hooks are in torch's own files;
    * inlined into a frame dynamo traces (a whole model under ``torch.compile``): it sees ``is_compiling()`` and
      runs the hook outside the graph (FSDP2's ``_dynamo_disable``)."""

    @functools.wraps(hook)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling():
            return torch._dynamo.disable(hook, recursive=True, reason="fully_shard hooks")(*args, **kwargs)
        return hook(*args, **kwargs)

    set_code_exec_strategy(wrapper.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    return wrapper


def overlap_default() -> bool:
    """Overlap communication with compute unless ``HYPER_PARALLEL_OVERLAP=0`` (or ``set_overlap(False)``)."""
    return os.environ.get("HYPER_PARALLEL_OVERLAP", "1") != "0"


@dataclass
class UnitSettings:
    """What the FSDP2 setters of ``FullyShardModule`` change on a unit."""

    reshard_after_forward: bool | None  # None: True except for the root (FSDP2's default)
    mp_policy: MixedPrecisionPolicy
    reshard_after_backward: bool = True
    overlap: bool = True
    forward_prefetch: list[FullyShardState] | None = None  # explicit targets (set_modules_to_...)
    backward_prefetch: list[FullyShardState] | None = None  # None: implicit (backward only)
    implicit_forward_prefetch: bool = False  # read on the root


@dataclass
class StepContext:
    """State the units of one root share (made by the root's first forward): the units, the orders of the
    first step (for prefetch), the reductions in flight and whether the end-of-backward callback is queued."""

    root: FullyShardState
    states: list[FullyShardState] = field(default_factory=list)  # every unit under the root, root first
    forward_order: list[FullyShardState] = field(default_factory=list)  # by pre-forward, first step
    post_forward_order: list[FullyShardState] = field(default_factory=list)  # by post-forward (backward reversed)
    order_recorded: bool = False
    reductions_in_flight: list[GroupReducer] = field(default_factory=list)  # async reductions, oldest first
    callback_queued: bool = False  # the end-of-backward callback of this step

    def advance_reductions(self) -> None:
        """Move every reduction in flight one stage on; keep those not yet finished."""
        still_in_flight = []
        for reducer in self.reductions_in_flight:
            finished = reducer.advance_reduction()
            if not finished:
                still_in_flight.append(reducer)
        self.reductions_in_flight = still_in_flight

    def finish_reductions(self) -> None:
        for reducer in self.reductions_in_flight:
            reducer.finish_reduction()
        self.reductions_in_flight = []


class FullyShardState:
    def __init__(
        self,
        modules: list[nn.Module],
        groups: list[ParamGroup],
        reshard_after_forward: bool | None,
        mp_policy: MixedPrecisionPolicy,
    ) -> None:
        self.modules = modules
        self.groups = groups  # one per parameter dtype (param_group.py); empty when the unit holds none
        self.settings = UnitSettings(reshard_after_forward, mp_policy, overlap=overlap_default())
        self.name = type(modules[0]).__name__
        self.parent_name = ""  # the enclosing unit's name: the trace label once this unit's backward is done
        self.context: StepContext | None = None  # the root's, shared by its units (first forward)
        self.training_state = IDLE
        self.progress = BackwardProgress()
        self._outer_module_label = ""
        for module in modules:
            module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
            module.register_forward_hook(self._post_forward)

    @property
    def is_root(self) -> bool | None:
        """None until the first forward decides the tree."""
        return None if self.context is None else self.context.root is self

    @property
    def reshards_after_forward(self) -> bool:
        if self.settings.reshard_after_forward is None:
            return not self.is_root
        return bool(self.settings.reshard_after_forward)

    def _transition(self, to: TrainingState, reset: bool = False) -> None:
        """The one way ``training_state`` changes (``step.TRANSITIONS``; ``reset``: back to IDLE from anywhere)."""
        check_transition(self.name, self.training_state, to, reset)
        self.training_state = to

    # ----- forward -----
    def _lazy_init(self) -> None:
        """The first unit whose forward runs with no initialised ancestor is the root of the tree."""
        if self.context is not None:
            return
        context = StepContext(root=self)
        names: dict[FullyShardState, str] = {}
        module_names = {id(module): name for name, module in self.modules[0].named_modules()}
        for name, module in self.modules[0].named_modules():
            state = getattr(module, "_hp_state", None)
            if state is None or state in names:
                continue
            context.states.append(state)
            names[state] = name
            state.context = context
            state.name = name or "root"
            for group in state.groups:
                group.rename(state.name)
                for param in group.params:  # names relative to the unit -> names in the model
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

    @_not_traced
    def _pre_forward(self, module: nn.Module, args, kwargs):
        if self.training_state is PRE_BACKWARD:  # recomputed inside backward (activation checkpointing)
            for group in self.groups:
                group.unshard(for_backward=True)  # no-op unless a nested unit resharded them meanwhile
            return self._cast_inputs(args, kwargs)
        first_in_pass = self.training_state is not FORWARD  # of a unit's modules, the first to run this pass
        self._lazy_init()
        context = self.context
        with trace.outside_compute(start_after=True if self.is_root else None):
            if first_in_pass:
                if self.is_root:
                    if context.callback_queued:  # the previous backward raised before its end: recover first
                        self.reset_iteration()
                    trace.set_phase("forward")
                for group in self.groups:
                    for param in group.params:  # trainable or frozen as the user set it since the last step
                        param.sync_requires_grad()
                self.progress.modules_run.clear()
                self._record_order(context.forward_order)
            self._transition(FORWARD)
            self._outer_module_label = trace.set_module(self.name)
            for group in self.groups:
                group.unshard()
            if first_in_pass:
                for state in self._forward_targets():
                    state.prefetch()
        args, kwargs = self._cast_inputs(args, kwargs)
        if first_in_pass and torch.is_grad_enabled():  # one unit pass, one backward to wait for (FSDP2)
            args, kwargs, hooked = hook_inputs(self, args, kwargs)
            self.progress.inputs_pending += hooked
        return args, kwargs

    def _cast_inputs(self, args, kwargs):
        policy = self.settings.mp_policy
        if policy.param_dtype is None or not policy.cast_forward_inputs:
            return args, kwargs
        return cast_floating(args, policy.param_dtype), cast_floating(kwargs, policy.param_dtype)

    @_not_traced
    def _post_forward(self, module: nn.Module, args, output):
        if self.training_state is PRE_BACKWARD:
            return cast_floating(output, self.settings.mp_policy.output_dtype)
        with trace.outside_compute():
            trace.set_module(self._outer_module_label)
            self.progress.modules_run.add(id(module))
            complete = len(self.progress.modules_run) == len(self.modules)
            if complete:  # a unit of several modules ends its pass with the last of them
                output = self._end_forward(output)
                if self.is_root:
                    output = self._end_partial_passes(output)
        return cast_floating(output, self.settings.mp_policy.output_dtype)

    def _end_forward(self, output):
        """Reshard (unless reshard_after_forward says otherwise) and hook the outputs for backward."""
        training = torch.is_grad_enabled()
        self._record_order(self.context.post_forward_order)
        if not training or self.reshards_after_forward:
            for group in self.groups:
                group.reshard(keep_post_forward_shard=training)
        self._transition(IDLE)
        return hook_outputs(self, output) if training else output

    def _end_partial_passes(self, output):
        """At the end of the root's forward, end the pass of every unit only some of whose modules ran (a chunked
        loss skips the head of fully_shard([norm, head])): its outputs are those of the root, as in FSDP2."""
        for state in reversed(self.context.states):
            if state is not self and state.training_state is FORWARD and state.progress.modules_run:
                output = cast_floating(state._end_forward(output), state.settings.mp_policy.output_dtype)
        return output

    # ----- prefetch: at most one unit gathered ahead -----
    def _record_order(self, order: list[FullyShardState]) -> None:
        """Orders are recorded during the first training step and used from the second on (as FSDP2); not
        from a forward recomputed inside backward (reentrant checkpointing), whose order is backward's."""
        if (
            torch.is_grad_enabled()
            and not self.context.order_recorded
            and self not in order
            and torch._C._current_graph_task_id() == -1
        ):
            order.append(self)

    def _neighbour(self, order: list[FullyShardState], step: int) -> list[FullyShardState]:
        if self.context is None or not self.context.order_recorded or self not in order:
            return []
        index = order.index(self) + step
        return [order[index]] if 0 <= index < len(order) else []

    def _forward_targets(self) -> list[FullyShardState]:
        """Explicit targets, else (opt-in) the unit whose forward comes next."""
        if self.settings.forward_prefetch is not None:
            return self.settings.forward_prefetch
        if self.context.root.settings.implicit_forward_prefetch:
            return self._neighbour(self.context.forward_order, 1)
        return []

    def _backward_targets(self) -> list[FullyShardState]:
        """Explicit targets, else (with overlap) the unit whose backward comes next: the one whose forward
        ended just before this one's."""
        if self.settings.backward_prefetch is not None:
            return self.settings.backward_prefetch
        return self._neighbour(self.context.post_forward_order, -1) if self.settings.overlap else []

    def prefetch(self, for_backward: bool = False) -> None:
        """Issue this unit's all-gather ahead of its use (asynchronous with overlap on)."""
        for group in self.groups:
            group.unshard(async_op=self.settings.overlap, for_backward=for_backward)

    # ----- backward -----
    @_not_traced
    def _pre_backward(self, grad):
        if self.training_state in (PRE_BACKWARD, POST_BACKWARD):
            return grad
        self._transition(PRE_BACKWARD)
        with trace.outside_compute():
            self._queue_end_of_backward()
            trace.set_module(self.name)
            for group in self.groups:
                group.unshard(for_backward=True)
            for state in self._backward_targets():
                state.prefetch(for_backward=True)
        return grad

    def _after_input_gradients(self) -> None:
        """Backward reached the inputs of one forward call; once it reached those of every call, backward is
        done with this unit: reduce its gradients, then reshard."""
        self._queue_end_of_backward()  # a backward through a unit's module called on its own reaches no output hook
        if self.progress.input_gradients_done() and self.training_state is not POST_BACKWARD:
            with trace.outside_compute():
                self._backward_done()

    def _queue_end_of_backward(self) -> None:
        """Once per backward, from whichever unit it reaches first: the loss may not use the root's output."""
        context = self.context
        if not context.callback_queued:
            context.callback_queued = True
            trace.set_phase("backward")
            Variable._execution_engine.queue_callback(context.root._end_of_backward)

    def _backward_done(self, backward_ran: bool = True) -> None:
        """Start this unit's gradient reduction and reshard. With overlap, the reductions already in flight
        move one stage on first (their reduce-scatters are waited for and their all-reduces issued), then
        this unit's reduce-scatter is issued and left in flight behind the next unit's backward."""
        self._transition(POST_BACKWARD)
        context = self.context
        overlap = self.settings.overlap
        for group in self.groups:
            if not group.has_trainable:
                continue
            if overlap:
                context.advance_reductions()
            group.reducer.reduce_grads(async_op=overlap, backward_ran=backward_ran)
            if group.reducer.reduction is not None:
                context.reductions_in_flight.append(group.reducer)
        if self.settings.reshard_after_backward:
            for group in self.groups:
                group.reshard()
        trace.set_module(self.parent_name)

    def _holds_unsharded_grads(self) -> bool:
        """Gradients reached this unit's parameters although backward never reached its outputs (the loss
        uses the root's inner modules, not its output): the same on every rank, as the graph is."""
        return any(p.unsharded_param.grad is not None for group in self.groups for p in group.params)

    def _end_of_backward(self) -> None:
        context = self.context
        with trace.outside_compute(start_after=False):
            for state in context.states:  # reached by this backward, or holding its gradients: reduce now
                if state.training_state is PRE_BACKWARD or (
                    state.training_state is not POST_BACKWARD and state._holds_unsharded_grads()
                ):
                    state._backward_done()
                elif any(group.reducer.has_pending_grads() for group in state.groups):
                    state._backward_done(backward_ran=False)
            context.finish_reductions()  # every gradient is written before the optimizer runs
            for state in context.states:
                for group in state.groups:
                    late = [p.fqn for p in group.params if p.unsharded_param.grad is not None]
                    if late:
                        raise RuntimeError(
                            f"fully_shard unit {state.name!r}: {late} got a gradient after the unit's gradients "
                            "were reduced (a parameter used only in an output that does not depend on the "
                            "unit's inputs); compute it inside a module that takes an input needing a gradient"
                        )
                    group.wait_for_unshard()  # a prefetch in flight must land before the optimizer
                    if state.settings.reshard_after_backward:
                        group.reshard()
                state.progress.modules_run.clear()
                state._transition(IDLE, reset=True)
            context.callback_queued = False
            context.order_recorded = True
            trace.set_phase("other")
            trace.set_module("")

    def reset_iteration(self) -> None:
        """After a forward or backward that raised (FSDP2's ``reset_iter_state``): land every collective in
        flight (every rank issued them, so every rank waits for them), drop the step's gradients still being
        reduced, reshard, and reset every unit for the next step."""
        states = self.context.states if self.context is not None else [self]
        if self.context is not None:
            self.context.reductions_in_flight = []
            self.context.callback_queued = False
        for state in states:
            for group in state.groups:
                group.reducer.discard_gradients()
                group.reshard()
            state.progress.reset()
            state._transition(IDLE, reset=True)
        trace.set_phase("other")
        trace.set_module("")

    # ----- explicit control -----
    def unshard(self) -> None:
        for group in self.groups:
            group.unshard()

    def reshard(self) -> None:
        for group in self.groups:
            group.reshard()
