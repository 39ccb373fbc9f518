"""The tier rows of the recipe matrix (A, B, C): named meshes of the dense and MoE workloads.

Each row is the keyword arguments of ``registry.Recipe`` (see ``matrix_dense``); a tier's description
is its title. Torch-free.
"""

from hyper_parallel.recipes.matrix_shapes import DENSE_WORKLOAD, MOE_SHAPES, MOE_WORKLOAD, SP_SHAPES, TRANSFORMER_SHAPES


def _tier(
    name: str,
    title: str,
    row: str,
    default: dict,
    implementation: str,
    shapes: dict,
    tier: str = "",
    alternatives: tuple = (),
) -> dict:
    """A tier A/B/C entry: a named mesh of an existing workload."""
    return dict(
        name=name,
        title=title,
        description=f"Tier {name}: {title}.",
        matrix_row=row,
        tier=tier,
        default=default,
        alternatives=alternatives,
        implementation=implementation,
        shapes=shapes,
    )


TIER_ROWS: list[dict] = [
    _tier(
        "A-TP",
        "TP only",
        "A-TP | tp=2/4 | Col/Row/all-gather vs reference",
        {"world_size": 2, "tp": 2},
        f"{DENSE_WORKLOAD}:tensor_parallel",
        TRANSFORMER_SHAPES,
        alternatives=({"world_size": 4, "tp": 4},),
    ),
    _tier(
        "A-CP",
        "CP only (CP ranks shard parameters)",
        "A-CP | cp=2/4 | CP attention vs full sequence",
        {"world_size": 2, "cp": 2},
        f"{DENSE_WORKLOAD}:fsdp_transformer",
        TRANSFORMER_SHAPES,
        alternatives=({"world_size": 4, "cp": 4},),
    ),
    _tier(
        "A-FSDP2",
        "FSDP only on the transformer",
        "A-FSDP2 | dp_shard=2 | parameter sharding, gradients",
        {"world_size": 2, "dp_shard": 2},
        f"{DENSE_WORKLOAD}:fsdp_transformer",
        TRANSFORMER_SHAPES,
    ),
    _tier(
        "A-EP",
        "EP only",
        "A-EP | ep=2 (MoE) | dispatch, expert forward and backward",
        {"world_size": 2, "dp_shard": 2, "ep": 2},
        f"{MOE_WORKLOAD}:expert_parallel",
        MOE_SHAPES,
    ),
    _tier(
        "B-1",
        "TP + FSDP2",
        "B-1 | TP + FSDP2 | fsdp_tp_example, Titan Llama3",
        {"world_size": 4, "dp_shard": 2, "tp": 2},
        f"{DENSE_WORKLOAD}:fsdp_transformer_without_sp",
        TRANSFORMER_SHAPES,
    ),
    _tier(
        "B-2",
        "TP + SP + FSDP2",
        "B-2 | TP + SP + FSDP2 | + enable_sequence_parallel",
        {"world_size": 4, "dp_shard": 2, "tp": 2},
        f"{DENSE_WORKLOAD}:fsdp_transformer",
        SP_SHAPES,
    ),
    _tier(
        "B-3",
        "CP + FSDP2",
        "B-3 | CP + FSDP2 | fsdp already contains cp",
        {"world_size": 4, "dp_shard": 2, "cp": 2},
        f"{DENSE_WORKLOAD}:fsdp_transformer",
        TRANSFORMER_SHAPES,
    ),
    _tier(
        "B-4",
        "TP + CP + FSDP2",
        "B-4 | TP + CP + FSDP2 | seq_len % (tp*2*cp)",
        {"world_size": 4, "cp": 2, "tp": 2},
        f"{DENSE_WORKLOAD}:fsdp_transformer",
        SP_SHAPES,
    ),
    _tier(
        "B-5",
        "HSDP: dp_replicate + fsdp",
        "B-5 | HSDP | get_mesh(['dp_replicate','fsdp'])",
        {"world_size": 4, "dp_replicate": 2, "dp_shard": 2},
        f"{DENSE_WORKLOAD}:fsdp_transformer",
        TRANSFORMER_SHAPES,
        tier="l1",
    ),
    _tier(
        "B-6",
        "EP + FSDP2 (no TP)",
        "B-6 | EP + FSDP2 | dual-stack FSDP",
        {"world_size": 4, "dp_shard": 4, "ep": 2},
        f"{MOE_WORKLOAD}:expert_parallel",
        MOE_SHAPES,
    ),
    _tier(
        "B-7",
        "EP + TP + ETP + FSDP2",
        "B-7 | EP + TP + (ETP) + FSDP2 | ETP=TP and ETP=1",
        {"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2, "etp": 2},
        f"{MOE_WORKLOAD}:expert_parallel",
        MOE_SHAPES,
        tier="l1",
        alternatives=({"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2, "etp": 1},),
    ),
    _tier(
        "C",
        "8-rank Titan-like grid (dp_replicate, dp_shard, cp, tp) = (1, 2, 2, 2)",
        "C | 8 ranks | (1,2,2,2) dense, MoE variant with ep=2, etp=2",
        {"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2},
        f"{DENSE_WORKLOAD}:fsdp_transformer",
        SP_SHAPES,
        tier="l2",
    ),
    _tier(
        "C-MoE",
        "8-rank grid (1, 2, 2, 2) with MoE, ep=2, etp=2",
        "C | 8 ranks | MoE variant, legal ep/etp pair",
        {"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2, "ep": 2, "etp": 2},
        f"{MOE_WORKLOAD}:expert_parallel",
        MOE_SHAPES,
        tier="l2",
    ),
]
