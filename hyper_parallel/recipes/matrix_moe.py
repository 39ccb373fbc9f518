"""The MoE rows of the recipe matrix (S1-S3): expert parallelism, ETP, and the all-gather dispatch.

Each row is the keyword arguments of ``registry.Recipe`` (see ``matrix_dense``). Torch-free.
"""

import dataclasses

from hyper_parallel.recipes.matrix_shapes import MOE, MOE_CALLS, MOE_CODE, MOE_SHAPES, MOE_WORKLOAD

MOE_ROWS: list[dict] = [
    dict(
        name="S1",
        title="MoE: EP (etp=1) + dual-stack FSDP",
        description="Experts Shard(0) over ep, tokens dispatched and combined by all-to-all; experts are a "
        "fully_shard unit on the sparse view (dp_replicate, efsdp), dense layers on (dp_replicate, "
        "fsdp). EP borrows ranks from dp_shard (and cp, tp): it is not a factor of world_size.",
        matrix_row="S1 | sparse | TP >=1 | SP * | CP 1..>1 | FSDP2 >0 | dp_rep 0..1 | EP >1 | ETP 1 | EP only, etp=1, dual-stack FSDP | mini MoE",
        tier="l2",
        default={"world_size": 4, "dp_shard": 4, "ep": 2},
        alternatives=({"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2},),
        implementation=f"{MOE_WORKLOAD}:expert_parallel",
        workload=MOE,
        torch_calls=MOE_CALLS,
        code=MOE_CODE,
        shapes=MOE_SHAPES,
        must_exceed_one=("ep",),
        must_be_one=("etp",),
    ),
    dict(
        name="S2",
        title="MoE: EP + ETP (etp = tp) + dual-stack FSDP",
        description="As S1, and each expert's hidden dim split over etp = tp (w1 colwise, w2 rowwise, partial "
        "outputs all-reduced over etp); the MoE sees the whole sequence of its tp group.",
        matrix_row="S2 | sparse | TP >1 | SP * | CP 1..>1 | FSDP2 >0 | dp_rep 0..1 | EP >1 | ETP tp | ETP=TP, dispatch on ep | mini MoE + ETP",
        tier="l2",
        default={"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2, "etp": 2},
        alternatives=({"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2, "ep": 2, "etp": 2},),
        implementation=f"{MOE_WORKLOAD}:expert_parallel",
        workload=MOE,
        torch_calls=MOE_CALLS,
        code=MOE_CODE,
        shapes=MOE_SHAPES,
        must_exceed_one=("ep", "etp"),
    ),
    dict(
        name="S3",
        title="MoE: S1's dims through all-gather dispatch",
        description="The same model and dims as S1 with a second implementation of the dispatch: tokens "
        "all-gathered over ep, local experts applied, outputs reduce-scattered back; its numbers "
        "must equal S1's.",
        matrix_row="S3 | sparse | TP any | SP * | CP 1..>1 | FSDP2 >0 | dp_rep 0..1 | EP >1 | ETP 1 | same dims as S1, other path | compare with S1",
        tier="",
        default={"world_size": 4, "dp_shard": 4, "ep": 2},
        alternatives=(),
        implementation=f"{MOE_WORKLOAD}:expert_parallel_all_gather",
        workload=dataclasses.replace(MOE, dispatch="all_gather"),
        torch_calls=MOE_CALLS,
        code=MOE_CODE,
        shapes=MOE_SHAPES,
        must_exceed_one=("ep",),
        must_be_one=("etp",),
    ),
]
