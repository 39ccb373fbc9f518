"""Float8 training with tensorwise dynamic scaling (torchao's ``Float8Linear``), and float8 TP on gloo.

Each converted linear casts its input and weight to ``float8_e4m3fn`` (3 mantissa bits, max 448) and its
output gradient to ``float8_e5m2`` (2 mantissa bits) with one scale per tensor, ``scale = max / amax``
(the tensor's largest magnitude lands on the format's largest value), and multiplies them with
``torch._scaled_mm`` into float32. Parameters, optimizer and everything between the linears stay float32.
The error it costs: each operand entry is rounded to 3 mantissa bits, a relative error of at most
``2**-4`` (``E4M3_UNIT_ROUNDOFF``), so a product ``x w`` is off by at most ``2**-3 + 2**-8`` of ``|x||w|``.

Float8 TP is torchtitan's plan with torchao's styles: each block's input is cast to float8 *before* its
all-gather over tp (``PrepareFloat8ModuleInput``), so the gather moves 1 byte per value instead of 4, and
the colwise / rowwise layers (``Float8ColwiseParallel`` / ``Float8RowwiseParallel``) compute on it. The
scales are global: a DTensor's amax is all-reduced over tp first, so a float8 TP model and the same model
converted on one process cast with the same scales.

gloo has no float8 element type: ``Float8WireAsBytes`` lets float8 tensors cross it as ``uint8`` of the
same bytes (bit for bit); NCCL moves float8 natively.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

from hyper_parallel.devices import default_device_type
from hyper_parallel.models.transformer import FeedForward, Transformer
from hyper_parallel.parallel.tp import check_heads, parallelize_root

FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
E4M3_UNIT_ROUNDOFF = 2.0**-4
"""Round to nearest with 3 stored mantissa bits: a value is off by at most half its last place, 2**-4 of it."""
E5M2_UNIT_ROUNDOFF = 2.0**-3
FLOAT8_LAYERS = ("attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2")
"""Which linears of a block run in float8: all of them; embeddings and the head stay float32 (torchtitan)."""
MLP_FLOAT8_LAYERS = ("w1", "w2")
"""The MLP's block linears (M4-F8); its input and head layers stay float32 (d_in 16 and d_out 8 are too small
for the 16-multiples ``torch._scaled_mm`` takes on a GPU, as the transformer's embeddings are not linears)."""
BLOCK_LINEARS = {"layers": FLOAT8_LAYERS, "blocks": MLP_FLOAT8_LAYERS}
"""Per model, the container of its blocks (the transformer's ``layers``, the MLP's ``blocks``) and which linears
of each block run in float8."""
_GATHERS = {"all_gather_into_tensor", "all_gather_into_tensor_coalesced", "wait_tensor"}


def require_scaled_mm(device: torch.device | str | None = None) -> None:
    """Float8 matmuls need ``torch._scaled_mm`` on ``device`` (default: the one runs use); raise with the fix
    where this build lacks it."""
    device = default_device_type() if device is None else device
    probe = getattr(torch, "_scaled_mm", None)
    if probe is not None:
        try:
            a = torch.zeros(16, 16, device=device).to(torch.float8_e4m3fn)
            one = torch.ones((), device=device)
            probe(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
            return
        except (RuntimeError, NotImplementedError) as error:
            reason = f"it fails on {device}: {error}"
    else:
        reason = "this build has no torch._scaled_mm"
    raise RuntimeError(
        f"float8 training multiplies with torch._scaled_mm, and {reason} (torch {torch.__version__}). "
        "Fix: install a torch with it (2.13's CPU build has it; on CUDA it needs compute capability 8.9+), "
        "or run the recipe without float8 (M3, M4)."
    )


def _import_torchao_float8():
    """torchao's float8 module; its CUDA kernels' libraries fail to load on a CPU build, which it logs
    as warnings on import (nothing float8 training uses): kept out of the logs."""
    log = logging.getLogger("torchao")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
        import torchao.float8.float8_tensor_parallel as float8_tp
    finally:
        log.setLevel(level)
    return float8, float8_tp


def is_block_linear(fqn: str) -> bool:
    """Whether the module named ``fqn`` is one of ``BLOCK_LINEARS`` (``layers.0.attention.wq``, ``blocks.1.w2``)."""
    container, _, rest = fqn.partition(".")
    return container in BLOCK_LINEARS and rest.split(".", 1)[-1] in BLOCK_LINEARS[container]


def convert_to_float8(model: nn.Module, enable_fsdp_float8_all_gather: bool = False) -> nn.Module:
    """Swap every block linear (``BLOCK_LINEARS``) for torchao's ``Float8Linear`` (tensorwise dynamic scaling),
    in place.

    ``enable_fsdp_float8_all_gather``: the weights become torchao's tensor subclass whose
    ``fsdp_pre_all_gather`` casts the local shard to float8 before fully_shard gathers it (the scale from
    the amax all-reduced over the shard ranks, so every rank casts with the whole weight's scale)."""
    float8, _ = _import_torchao_float8()
    config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=enable_fsdp_float8_all_gather)
    float8.convert_to_float8_training(model, module_filter_fn=lambda _, fqn: is_block_linear(fqn), config=config)
    return model


def parallelize_transformer_float8_tp(model: Transformer, tp_mesh: DeviceMesh) -> Transformer:
    """TP + SP on a float8-converted model with float8 all-gathers of the block inputs (torchtitan's plan)."""
    _, float8_tp = _import_torchao_float8()
    check_heads(model.config.n_heads, tp_mesh.size())
    parallelize_root(model, tp_mesh, sequence_parallel=True)
    seq = Shard(1)
    for layer in model.layers:
        if not isinstance(layer.feed_forward, FeedForward):
            raise ValueError("float8 TP runs dense feed-forwards; this model has a MoE layer")
        plan = {
            "attention_norm": SequenceParallel(),
            "ffn_norm": SequenceParallel(),
            "attention": float8_tp.PrepareFloat8ModuleInput(
                input_layouts=(seq, None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": float8_tp.Float8ColwiseParallel(),
            "attention.wk": float8_tp.Float8ColwiseParallel(),
            "attention.wv": float8_tp.Float8ColwiseParallel(),
            "attention.wo": float8_tp.Float8RowwiseParallel(output_layouts=seq),
            "feed_forward": float8_tp.PrepareFloat8ModuleInput(
                input_layouts=(seq,), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": float8_tp.Float8ColwiseParallel(),
            "feed_forward.w2": float8_tp.Float8RowwiseParallel(output_layouts=seq),
        }
        parallelize_module(layer, tp_mesh, plan)
    return model


def _plain_or_dtensor(types) -> bool:
    return all(issubclass(t, DTensor) or t.__torch_dispatch__ is torch.Tensor.__torch_dispatch__ for t in types)


class Float8WireAsBytes(TorchDispatchMode):
    """Inside the block, a functional all-gather of a float8 tensor runs on its ``uint8`` view (the same
    bytes, so the same values land): gloo refuses float8 element types. A tensor subclass (torchao's
    ``Float8TrainingTensor``) unwraps first, and its inner all-gather of float8 data comes back here."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _plain_or_dtensor(types):
            return NotImplemented
        tensor = args[0] if args else None
        if (
            func.namespace == "_c10d_functional"
            and func._overloadpacket.__name__ in _GATHERS
            and isinstance(tensor, torch.Tensor)
            and tensor.dtype in FLOAT8_DTYPES
        ):
            out = func(tensor.view(torch.uint8), *args[1:], **kwargs)
            if func._overloadpacket.__name__ != "wait_tensor":
                out = torch.ops._c10d_functional.wait_tensor(out)
            return out.view(tensor.dtype)
        return func(*args, **kwargs)


@dataclass(frozen=True)
class Float8LossError:
    """How far float8 casts can move a loss, to first order (``float8_loss_error``)."""

    worst: float  # every rounding error at its largest and all pushing the same way
    sigma: float  # the standard deviation when the rounding errors are independent and unbiased


def float8_loss_error(model: nn.Module, inputs: dict[str, torch.Tensor]) -> Float8LossError:
    """The loss change float8 casts of the block linears' inputs and weights cause, derived from e4m3.

    ``model`` is the float32 model after ``loss.backward()``; ``inputs`` its block linears' inputs
    (``record_linear_inputs``). Rounding an operand entry ``a`` to e4m3 gives ``a (1 + d)`` with ``|d| <= u``
    (u = 2**-4, 3 mantissa bits; the fp32 scale multiply adds ~2**-24, ignored), so to first order
    ``dL = sum d * a * dL/da`` over every entry of every linear's input ``x`` and weight ``w``:

        worst  = u * sum |a * dL/da|              (every d = +-u, aligned)
        sigma  = u * sqrt(sum (a * dL/da)**2)     (independent d of mean 0 and variance <= u**2)

    ``dL/dx = g w`` and ``dL/dw = g^T x`` with ``g`` the linear's output gradient. First order: it ignores
    how one layer's error changes the next one's, a term of order u**2."""
    u = E4M3_UNIT_ROUNDOFF
    worst, variance = 0.0, 0.0
    for fqn, module in model.named_modules():
        if fqn not in inputs:
            continue
        x = inputs[fqn].reshape(-1, module.in_features)
        g = module.output_grad.reshape(-1, module.out_features)
        w = module.weight.detach()
        for a, grad in ((x, g @ w), (w, g.t() @ x)):
            terms = (a * grad).double()
            worst += u * float(terms.abs().sum())
            variance += u**2 * float((terms**2).sum())
    return Float8LossError(worst=worst, sigma=variance**0.5)


def record_linear_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    """Hooks that keep, for every block linear of ``model``, its input (returned dict, filled by the next
    forward) and its output gradient (``module.output_grad``, filled by the next backward)."""
    inputs: dict[str, torch.Tensor] = {}
    for fqn, module in model.named_modules():
        if not (isinstance(module, nn.Linear) and is_block_linear(fqn)):
            continue

        def keep_input(mod, args, output, fqn=fqn):
            inputs[fqn] = args[0].detach()
            output.register_hook(lambda grad, mod=mod: setattr(mod, "output_grad", grad.detach()))

        module.register_forward_hook(keep_input)
    return inputs
