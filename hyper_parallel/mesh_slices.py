"""One sub-mesh object per mesh and dim names, built on first use.

``DeviceMesh.__getitem__`` builds a new sub-mesh on every call (its layout, rank tensor and coordinates:
~3 ms each on the 2-core machine), and ``fully_shard`` slices the same mesh for each parameter it wraps
(S2, one rank: 79 slices, 0.24 s of a 1.25 s warm run). The slices of a mesh are equal whenever they are
built (same ranks, layout, names, and the same process groups, looked up by name from the root mesh), so
the first one serves every later call; it lives on the mesh it was sliced from and goes with it.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh

_SLICES = "_hyper_parallel_slices"


def sub_mesh(mesh: DeviceMesh, names: str | tuple[str, ...]) -> DeviceMesh:
    """``mesh[names]``, the same object on every call for the same ``mesh`` and ``names``."""
    key = names if isinstance(names, str) else tuple(names)
    slices = mesh.__dict__.get(_SLICES)
    if slices is None:
        slices = mesh.__dict__[_SLICES] = {}
    if key not in slices:
        slices[key] = mesh[key]
    return slices[key]
