"""Float8 training (hyper_parallel.parallel.float8, torchao's Float8Linear) in one process, no workers.

* The cast: torchao's tensorwise cast of a tensor to e4m3 rounds each entry to within 2**-4 of it
  (relative; the scale maps amax to 448, so no entry falls below e4m3's smallest normal here) and its
  bytes are a quarter of float32's.
* The error it costs: on the mini transformer of the recipes, the float8 model's loss differs from the
  float32 model's by at most 6 sigma of ``float8_loss_error`` (derived from e4m3's 3 mantissa bits: a sum
  of independent roundings exceeds 6 of its standard deviations with probability ~1e-9), and at most its
  worst case; and 6 sigma is small next to the loss, so a wrong scale or a missed cast fails.
* A torch without ``_scaled_mm`` is refused with the fix (tests/test_bad_input.py: before any worker).
"""

from __future__ import annotations

import copy

import pytest
import torch

from hyper_parallel.models.transformer import Transformer, TransformerConfig, lm_loss, token_batch
from hyper_parallel.parallel import float8
from hyper_parallel.parallel.float8 import (
    E4M3_UNIT_ROUNDOFF,
    convert_to_float8,
    float8_loss_error,
    record_linear_inputs,
    require_scaled_mm,
)

CONFIG = TransformerConfig()  # the recipes' model: d_model 32, hidden 64, 2 layers
BATCH = 8


def test_tensorwise_cast_rounds_to_three_mantissa_bits():
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    torch.manual_seed(0)
    x = torch.randn(64, 32) * 3
    cast = hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, LinearMMConfig())
    assert cast._data.dtype == torch.float8_e4m3fn and cast._data.element_size() * 4 == x.element_size()
    assert float(cast._scale) == pytest.approx(448 / float(x.abs().max()), rel=1e-6)  # amax lands on e4m3's max
    back = cast.to_original_precision()
    normal = x.abs() * cast._scale >= 2.0**-6  # e4m3's smallest normal, after scaling
    relative = ((back - x).abs() / x.abs())[normal]
    assert float(relative.max()) <= E4M3_UNIT_ROUNDOFF


def _loss_and_inputs(model: Transformer, tokens, targets):
    inputs = record_linear_inputs(model)
    loss = lm_loss(model(tokens), targets)
    loss.backward()
    return loss, inputs


def test_float8_loss_within_the_bound_derived_from_e4m3():
    torch.manual_seed(0)
    model = Transformer(CONFIG)
    low = convert_to_float8(copy.deepcopy(model))
    tokens, targets = token_batch(CONFIG, BATCH, 0)
    loss, inputs = _loss_and_inputs(model, tokens, targets)
    error = float8_loss_error(model, inputs)
    with torch.no_grad():
        difference = abs(lm_loss(low(tokens), targets).item() - loss.item())
    assert 0 < difference <= min(6 * error.sigma, error.worst)
    assert 6 * error.sigma < 0.01 * loss.item()  # a bound loose enough to pass anything would not be a check


def test_a_build_without_scaled_mm_is_refused(monkeypatch):
    require_scaled_mm("cpu")
    monkeypatch.delattr(torch, "_scaled_mm")
    with pytest.raises(RuntimeError, match="this build has no torch._scaled_mm.*Fix: install a torch with it"):
        float8.require_scaled_mm("cpu")
