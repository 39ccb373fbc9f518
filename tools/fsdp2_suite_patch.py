"""Imported first by every test file of torch's FSDP2 suite that tools/fsdp2_suite.py runs (copied next to them as
``_hp_suite_patch.py``): it makes the suite run on CPU/gloo here, and on the ``ours`` side puts hyper_parallel's
``fully_shard`` under every name the tests import torch's from.

Why each change: the suite is written for GPUs. ``skip_if_lt_x_gpu`` would skip nearly every test on a machine
without one, although gloo runs them; ``common_fsdp.DEVICE_COUNT`` is 1 on CPU, which makes the thread-based tests
single-rank, and ``FSDPTest`` skips every rank beyond ``torch.accelerator.device_count()``; a test class asking for more than 4 ranks is capped at 4 (2 cores here: 8 processes time out).
"""

from __future__ import annotations

import datetime
import functools
import inspect
import os
import unittest

import torch
import torch.testing._internal.common_distributed as common_distributed

MAX_RANKS = 4
SIDE_VARIABLE = "HP_FSDP2_SUITE_SIDE"


def _run_whatever_the_gpu_count(_count, *_args, **_kwargs):
    """Replaces ``skip_if_lt_x_gpu``: gloo gives every rank a CPU, so the GPU count is no reason to skip."""
    return lambda test: test


common_distributed.skip_if_lt_x_gpu = _run_whatever_the_gpu_count
# A continuous class's process group times out after 120 s, a rank's result after 300 s: too short on a loaded
# 2-core host (the runner passes its per-test limit in DISTRIBUTED_TESTS_DEFAULT_TIMEOUT for both).
common_distributed.MultiProcContinuousTest.timeout = datetime.timedelta(
    seconds=int(os.environ.get("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "300"))
)

import torch.testing._internal.common_fsdp as common_fsdp  # noqa: E402  (after the skip is lifted: it imports it)

common_fsdp.DEVICE_COUNT = MAX_RANKS
if torch.accelerator.current_accelerator() is None:  # FSDPTest skips a rank whose world exceeds this count
    torch.accelerator.device_count = lambda: MAX_RANKS


class _AnyHardware:
    """Newer test files tag classes with ``common_utils.HardwareClassification.X``, which torch 2.13's helpers
    lack; the tag only sorts CI jobs, so any name will do."""

    def __getattr__(self, name: str) -> str:
        return name


import torch.testing._internal.common_utils as common_utils  # noqa: E402

if not hasattr(common_utils, "HardwareClassification"):
    common_utils.HardwareClassification = _AnyHardware()

import torch.testing._internal.common_device_type as common_device_type  # noqa: E402


def _keep_the_generic_class(generic_test_class, _scope, *_args, **_kwargs) -> None:
    """Replaces ``instantiate_device_type_tests``: newer files instantiate their classes per device with
    ``except_for=["cpu"]``, which leaves nothing to run on CPU; the generic class (left in the module) runs them
    on gloo instead, its tests that take the per-device ``device`` argument given ``"cpu"``."""
    for name, test in list(vars(generic_test_class).items()):
        if name.startswith("test") and callable(test) and "device" in inspect.signature(test).parameters:
            setattr(generic_test_class, name, _given_the_cpu(test))


def _given_the_cpu(test):
    """``test(self, device)`` as the generic class's ``test(self)``, the device a per-device class would pass."""

    @functools.wraps(test)
    def on_cpu(self):
        return test(self, "cpu")

    del on_cpu.__wrapped__  # unittest and pytest read the signature: it takes no device now
    return on_cpu


common_device_type.instantiate_device_type_tests = _keep_the_generic_class


def _put_ours_under_torchs_names() -> None:
    """``from torch.distributed.fsdp import fully_shard`` (and the older spellings, and common_fsdp's own
    import) then give hyper_parallel's. hyper_parallel is imported first, so its own reference to torch's
    ``fully_shard`` (torch_interop) stays torch's."""
    import torch.distributed._composable.fsdp as composable_fsdp
    import torch.distributed._composable.fsdp.fully_shard as composable_fully_shard
    import torch.distributed.fsdp as fsdp
    import torch.distributed.fsdp._fully_shard as fully_shard_package

    from hyper_parallel.fsdp import fully_shard as ours

    for module in (fsdp, fully_shard_package, composable_fsdp, composable_fully_shard, common_fsdp):
        module.fully_shard = ours


if os.environ.get(SIDE_VARIABLE) == "ours":
    _put_ours_under_torchs_names()


def cap_world_sizes(namespace: dict) -> None:
    """Every test class of a test module asks for at most ``MAX_RANKS`` ranks (called at the module's end)."""
    for value in list(namespace.values()):
        if not (isinstance(value, type) and issubclass(value, unittest.TestCase)):
            continue
        declared = value.__dict__.get("world_size")
        if isinstance(declared, property):
            value.world_size = property(lambda self, _get=declared.fget: min(MAX_RANKS, _get(self)))


__all__ = ["cap_world_sizes", "torch"]
