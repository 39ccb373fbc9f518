"""The names of the mesh dims, defined once (docs/design.md §2).

Code that names a dim (a view lookup ``views[MeshDim.TP]``, a group, a mesh's ``mesh_dim_names``)
takes it from here, so a typo is an ``AttributeError`` naming the typo where it runs (and an error in
any type checker or editor) rather than a mesh that is not found. The values are plain strings: a DeviceMesh, a trace file and an error message show
``"tp"``, and ``ParallelDims(tp=2)`` keeps its keyword arguments. The orders the degrees are listed in and
the one way they are written as text (``degrees_label``) live here too.
"""

from __future__ import annotations

from collections.abc import Mapping


class MeshDim:
    """Degrees a run chooses (the fields of ``ParallelDims``) and the dims derived from them."""

    DP_REPLICATE = "dp_replicate"  # HSDP replicas: gradients all-reduced across them
    DP_SHARD = "dp_shard"  # data-parallel ranks that shard parameters
    CP = "cp"  # context parallel: the sequence split across ranks (K/V exchanged: all-gather or ring)
    ULYSSES = "ulysses"  # the sequence split again, heads resharded by all-to-all for attention (VeOmni's name)
    TP = "tp"  # tensor parallel, always the innermost dim
    PP = "pp"  # pipeline stages, always the outermost dim
    EP = "ep"  # expert parallel: experts split across ranks borrowed from dp_shard * cp (* tp)
    ETP = "etp"  # expert tensor parallel: 1 or tp

    FSDP = "fsdp"  # dp_shard * cp * ulysses: where parameters are sharded
    DP = "dp"  # dp_replicate * dp_shard: where data is split
    DP_CP = "dp_cp"  # dp * cp * ulysses: where the loss is averaged
    EFSDP = "efsdp"  # dp_shard * cp * tp / (ep * etp): where experts are sharded

    WORLD = "world"  # the 1-D root mesh every view is unflattened from


DEGREE_NAMES = (
    MeshDim.DP_REPLICATE,
    MeshDim.DP_SHARD,
    MeshDim.CP,
    MeshDim.ULYSSES,
    MeshDim.TP,
    MeshDim.PP,
    MeshDim.EP,
    MeshDim.ETP,
)
"""The degrees a run chooses, in ``ParallelDims``' field order."""
DEGREE_KEYS = ("world_size", *DEGREE_NAMES)
"""A run's degrees as ``ParallelDims.degrees()`` gives them: the world size, then the degrees."""
MESH_ORDER = (MeshDim.PP, *(name for name in DEGREE_NAMES if name != MeshDim.PP))
"""The degrees as the mesh nests them, outermost first (pp is every view's outermost dim): the order text shows."""
STAGE_DEGREES = MESH_ORDER[1:]
"""The degrees inside one pipeline stage."""
WORLD_FACTORS = tuple(name for name in DEGREE_NAMES if name not in (MeshDim.EP, MeshDim.ETP))
"""The degrees whose product is world_size; ep and etp borrow ranks of them."""
DERIVED_NAMES = (MeshDim.FSDP, MeshDim.DP, MeshDim.DP_CP, MeshDim.EFSDP)
"""The dims built from the degrees (``ParallelDims``' properties of the same names)."""

# fully_shard's all-reduce group when a unit does not shard: the replicate and shard dims joined.
UNSHARDED_DP_GROUP = f"{MeshDim.DP_REPLICATE}+{MeshDim.FSDP}"
# The groups a dense fully_shard unit's collectives run on (all-gather / reduce-scatter, HSDP's all-reduce).
FSDP_GROUPS = (MeshDim.FSDP, MeshDim.DP_REPLICATE, UNSHARDED_DP_GROUP)


def active_degrees(degrees: Mapping[str, int]) -> dict[str, int]:
    """The degrees other than 1 (world_size apart), outermost first."""
    return {name: degrees[name] for name in MESH_ORDER if degrees.get(name, 1) != 1}


def degrees_label(degrees: Mapping[str, int], *, world: bool = False, sep: str = ", ") -> str:
    """A run's degrees as text, the one way every table, message and widget writes them: the degrees other
    than 1, outermost first (``"pp=2, dp_shard=2"``, or ``"-"`` when none); ``world=True`` puts the world
    size first (``"world_size=4: pp=2, dp_shard=2"``). ``ParallelDims.label`` is this for a ``ParallelDims``."""
    active = sep.join(f"{name}={value}" for name, value in active_degrees(degrees).items())
    if world:
        return f"world_size={degrees.get('world_size', '?')}" + (f": {active}" if active else "")
    return active or "-"
