"""The names of the mesh dims, defined once (docs/design.md §2).

Code that names a dim (a view lookup ``views[MeshDim.TP]``, a group, a mesh's ``mesh_dim_names``)
takes it from here, so a typo is an ``AttributeError`` naming the typo where it runs (and an error in
any type checker or editor) rather than a mesh that is not found. The values are plain strings: a DeviceMesh, a trace file and an error message show
``"tp"``, and ``ParallelDims(tp=2)`` keeps its keyword arguments.
"""


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
DERIVED_NAMES = (MeshDim.FSDP, MeshDim.DP, MeshDim.DP_CP, MeshDim.EFSDP)

# fully_shard's all-reduce group when a unit does not shard: the replicate and shard dims joined.
UNSHARDED_DP_GROUP = f"{MeshDim.DP_REPLICATE}+{MeshDim.FSDP}"
# The groups a dense fully_shard unit's collectives run on (all-gather / reduce-scatter, HSDP's all-reduce).
FSDP_GROUPS = (MeshDim.FSDP, MeshDim.DP_REPLICATE, UNSHARDED_DP_GROUP)
