"""Which device and backend a run uses: the accelerator when torch sees one, else the CPU.

Decided here once, so that no other module names a device: workers pick the device type and its backend
(``default_device_type``, ``backend_for``), and the recipes put their tensors on the device of their mesh
(``device_of``). ``tests/test_devices.py`` greps the package for device names written anywhere else.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch
from torch.distributed.device_mesh import DeviceMesh

CPU = "cpu"
BACKENDS = {"cuda": "nccl", CPU: "gloo"}
HOST = torch.device(CPU)
"""Where recipes draw initial weights and batches (the CPU's generator), so that a run on any device starts
from the same numbers; TP, EP and fully_shard then move the parameters to their mesh's device."""


_INITIAL_WEIGHTS = threading.Lock()


@contextlib.contextmanager
def seeded_on_host(seed: int) -> Iterator[None]:
    """Modules built inside draw their initial weights on the host from ``seed``: the same numbers on any
    device. Ranks that are threads of one process (torch's threaded process group, ``make gpu-smoke``) share
    torch's one global generator, so one rank's draws are kept from interleaving with another's."""
    with _INITIAL_WEIGHTS:
        torch.manual_seed(seed)
        with HOST:
            yield


def default_device_type() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else CPU


def backend_for(device_type: str) -> str:
    """The process-group backend for tensors of ``device_type``: NCCL on GPUs, gloo on the CPU."""
    if device_type not in BACKENDS:
        raise ValueError(f"no backend known for device type {device_type!r}; known: {sorted(BACKENDS)}")
    return BACKENDS[device_type]


def bind_local_device(device_type: str) -> None:
    """Give this rank its own accelerator (``LOCAL_RANK``) before its process group starts; nothing on CPU."""
    if device_type != CPU:
        torch.get_device_module(device_type).set_device(int(os.environ.get("LOCAL_RANK", 0)))


def device_of(mesh: DeviceMesh) -> torch.device:
    """The device of this rank's tensors on ``mesh`` (an accelerator with this rank's index)."""
    if mesh.device_type == CPU:
        return torch.device(CPU)
    return torch.device(mesh.device_type, torch.get_device_module(mesh.device_type).current_device())
