"""Where a fully_shard unit meets autograd and mixed precision: its forward inputs and outputs.

Tensors are found inside tuples, lists, dicts, named tuples and dataclasses (FSDP2's traversal), so a
dataclass passed between units is hooked and cast like a tensor:

* inputs that need a gradient pass through ``RunAfterInputGradients``, whose backward runs once their
  gradients are computed: backward is then done with the unit (``FullyShardState._after_input_gradients``);
* outputs that need a gradient get a hook that runs when backward reaches the unit
  (``FullyShardState._pre_backward``); under a functorch transform (``torch.func.jvp``) outputs that report
  no gradient pass through ``RunBeforeBackward`` instead, as FSDP2 does;
* ``cast_floating`` applies ``MixedPrecisionPolicy``'s ``param_dtype`` to inputs and ``output_dtype`` to outputs.

Both Functions define ``setup_context`` and ``jvp`` so that functorch transforms can run through a unit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.utils import _apply_to_tensors


def walk_collect_grad_tensors(tree: Any) -> tuple[torch.Tensor, ...]:
    """torch's ``collect_grad_tensors`` (2.13) by ``_apply_to_tensors``' walk, for a torch that lacks it."""
    found: list[torch.Tensor] = []
    _apply_to_tensors(lambda t: found.append(t) or t if t.requires_grad else t, tree)
    return tuple(found)


def walk_replace_grad_tensors(tree: Any, replacements) -> Any:
    """torch's ``replace_grad_tensors`` (2.13) by the same walk as ``walk_collect_grad_tensors``."""
    return _apply_to_tensors(lambda t: next(replacements) if t.requires_grad else t, tree)


try:
    from torch.distributed.fsdp._common_utils import collect_grad_tensors, replace_grad_tensors
except ImportError:  # torch < 2.13 (the CUDA images `make gpu-smoke` meets ship 2.11)
    collect_grad_tensors, replace_grad_tensors = walk_collect_grad_tensors, walk_replace_grad_tensors


class RunAfterInputGradients(torch.autograd.Function):
    """Identity on a unit's forward inputs; its backward runs once their gradients are computed, i.e. once
    backward is done with every weight of the unit, frozen ones included."""

    generate_vmap_rule = True

    @staticmethod
    def forward(state, *inputs: torch.Tensor):
        return inputs

    @staticmethod
    def setup_context(ctx, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.state = inputs[0]

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        ctx.state._after_input_gradients()
        return (None, *grads)

    @staticmethod
    def jvp(ctx, state_tangent, *tangents: torch.Tensor):
        return tangents


class RunBeforeBackward(torch.autograd.Function):
    """Identity on an output under a functorch transform; its backward is the unit's pre-backward hook."""

    generate_vmap_rule = True

    @staticmethod
    def forward(state, output: torch.Tensor):
        return output

    @staticmethod
    def setup_context(ctx, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.state = inputs[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, ctx.state._pre_backward(grad)

    @staticmethod
    def jvp(ctx, state_tangent, tangent: torch.Tensor | None):
        return tangent


def cast_floating(tree: Any, dtype: torch.dtype | None) -> Any:
    """Every floating-point tensor of ``tree`` in ``dtype`` (``tree`` itself when ``dtype`` is None)."""
    if dtype is None:
        return tree
    return _apply_to_tensors(lambda t: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t, tree)


def hook_inputs(state, args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    """``args``/``kwargs`` with the tensors that need a gradient passed through ``RunAfterInputGradients``,
    and whether there were any."""
    tensors = collect_grad_tensors((args, kwargs))
    if not tensors:
        return args, kwargs, False
    hooked = RunAfterInputGradients.apply(state, *tensors)
    args, kwargs = replace_grad_tensors((args, kwargs), iter(hooked))
    return args, kwargs, True


def hook_outputs(state, output: Any) -> Any:
    """Register ``state._pre_backward`` on every output that needs a gradient."""
    for tensor in collect_grad_tensors(output):
        tensor.register_hook(state._pre_backward)
    if torch._C._are_functorch_transforms_active():
        return _apply_to_tensors(
            lambda t: (
                t
                if t.requires_grad or not (t.is_floating_point() or t.is_complex())
                else RunBeforeBackward.apply(state, t)
            ),
            output,
        )
    return output
