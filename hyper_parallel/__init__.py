"""hyper_parallel: multi-dimensional parallel training on one DeviceMesh (runs inside every worker).

``ParallelDims`` needs no torch import (the launcher validates degrees with it in a fraction of a
second); ``build_mesh``, ``fully_shard``, ``clip_grad_norm_``, ``MixedPrecisionPolicy`` and ``GroupInfo`` load
torch.distributed on first use.
"""

from hyper_parallel.mesh import ParallelDims, valid_choices

__all__ = [
    "ParallelDims",
    "valid_choices",
    "build_mesh",
    "fully_shard",
    "clip_grad_norm_",
    "MixedPrecisionPolicy",
    "GroupInfo",
]

_LAZY = {
    "build_mesh": "hyper_parallel.mesh_views",
    "fully_shard": "hyper_parallel.fsdp",
    "clip_grad_norm_": "hyper_parallel.fsdp",
    "MixedPrecisionPolicy": "hyper_parallel.fsdp",
    "GroupInfo": "hyper_parallel.comm",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hyper_parallel' has no attribute {name!r}")
