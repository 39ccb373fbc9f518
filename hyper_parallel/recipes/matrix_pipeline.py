"""The pipeline rows of the recipe matrix (P1-P5): 1F1B, GPipe, interleaved, ZB-V and DualPipeV schedules, with
FSDP, TP or EP.

Each row is the keyword arguments of ``registry.Recipe`` (see ``matrix_dense``). Torch-free.
"""

import dataclasses

from hyper_parallel.recipes.matrix_shapes import (
    PIPELINE_1F1B,
    PIPELINE_CALLS,
    PIPELINE_CODE,
    PIPELINE_SHAPES,
    PIPELINE_WORKLOAD,
)

PIPELINE_ROWS: list[dict] = [
    dict(
        name="P1",
        title="pipeline (1F1B) x FSDP",
        description="The transformer cut by layers into pp stages on torch.distributed.pipelining; each stage "
        "is fully_shard over its own (dp_replicate, fsdp) ranks. Schedule1F1B: stage s runs pp-1-s warm-up "
        "forwards (the last stage none), then alternates one forward, one backward; activations and their gradients "
        "cross stages by send/recv, 4 microbatches per step.",
        matrix_row="P1 | dense | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1, 1F1B, n_layers % pp | mini transformer (4 layers)",
        tier="l1",
        default={"world_size": 4, "pp": 2, "dp_shard": 2},
        alternatives=({"world_size": 2, "pp": 2},),
        implementation=f"{PIPELINE_WORKLOAD}:one_f_one_b",
        workload=PIPELINE_1F1B,
        torch_calls=PIPELINE_CALLS,
        code=PIPELINE_CODE,
        shapes=PIPELINE_SHAPES,
        must_be_one=("cp", "tp", "ep"),
        must_exceed_one=("pp",),
    ),
    dict(
        name="P1-G",
        title="pipeline (GPipe) x FSDP",
        description="P1 with ScheduleGPipe: every microbatch's forward, then every backward (fill-drain); the "
        "same bubble as 1F1B, but all microbatches' activations alive at once. Same losses as P1.",
        matrix_row="P1-G | dense | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1, GPipe | mini transformer (4 layers)",
        tier="",
        default={"world_size": 4, "pp": 2, "dp_shard": 2},
        alternatives=(),
        implementation=f"{PIPELINE_WORKLOAD}:gpipe",
        workload=dataclasses.replace(PIPELINE_1F1B, schedule="gpipe"),
        shapes=PIPELINE_SHAPES,
        must_be_one=("cp", "tp", "ep"),
        must_exceed_one=("pp",),
    ),
    dict(
        name="P1-I",
        title="pipeline (interleaved 1F1B, 2 stages per rank) x FSDP",
        description="P1 with 4 stages of one layer, 2 per rank in a loop (rank r holds stages r and r+pp): "
        "ScheduleInterleaved1F1B shrinks the bubble by the number of stages per rank, for twice "
        "the sends. Same losses as P1.",
        matrix_row="P1-I | dense | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1, interleaved, n_layers % (2 pp) | mini transformer (4 layers)",
        tier="",
        default={"world_size": 4, "pp": 2, "dp_shard": 2},
        alternatives=(),
        implementation=f"{PIPELINE_WORKLOAD}:interleaved",
        workload=dataclasses.replace(PIPELINE_1F1B, schedule="interleaved_1f1b"),
        shapes={**PIPELINE_SHAPES, "stages_per_rank": 2},
        must_be_one=("cp", "tp", "ep"),
        must_exceed_one=("pp",),
    ),
    dict(
        name="P2",
        title="pipeline (1F1B) x FSDP x TP",
        description="P1 with tensor parallelism inside every stage (TP without SP, as B-1): each stage is a "
        "(dp_replicate, fsdp, tp) mesh of its own; the activations sent between stages are "
        "replicated over tp, so each tp rank sends its copy to its peer of the next stage.",
        matrix_row="P2 | dense | TP >1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1 x TP, 1F1B | mini transformer (4 layers)",
        tier="l2",
        default={"world_size": 8, "pp": 2, "dp_shard": 2, "tp": 2},
        alternatives=({"world_size": 4, "pp": 2, "tp": 2},),
        implementation=f"{PIPELINE_WORKLOAD}:one_f_one_b",
        workload=PIPELINE_1F1B,
        shapes=PIPELINE_SHAPES,
        must_be_one=("cp", "ep"),
        must_exceed_one=("pp", "tp"),
    ),
    dict(
        name="P3",
        title="pipeline (1F1B) x EP (MoE) x FSDP",
        description="P1 on a 4-layer MoE transformer (layers 1 and 3 MoE: one per stage); inside each stage "
        "the experts are spread over ep (all-to-all dispatch per microbatch) and are a fully_shard "
        "unit on the stage's sparse view, as in S1.",
        matrix_row="P3 | sparse | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP >1 | ETP 1 | PP >1 x EP, 1F1B | mini MoE (4 layers)",
        tier="",
        default={"world_size": 4, "pp": 2, "dp_shard": 2, "ep": 2},
        alternatives=(),
        implementation=f"{PIPELINE_WORKLOAD}:expert_parallel",
        workload=dataclasses.replace(PIPELINE_1F1B, moe=True),
        shapes={**PIPELINE_SHAPES, "num_experts": 4, "expert_hidden_sizes": (32,)},
        must_be_one=("cp", "tp", "etp"),
        must_exceed_one=("pp", "ep"),
    ),
    dict(
        name="P4",
        title="pipeline (zero bubble, ZB-V) x FSDP",
        description="An 8-layer transformer in 2 pp stages per rank placed in a V (rank r holds stages r and "
        "2pp-1-r): ScheduleZBVZeroBubble splits each backward into B, the input gradient the previous stage "
        "waits for, and W, the weight gradient only the optimizer needs, and runs the W in what would be idle "
        "time. Each stage is fully_shard over (dp_replicate, fsdp) as in P1.",
        matrix_row="P4 | dense | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1, ZB-V (B/W split), n_layers % (2 pp) | mini transformer (8 layers)",
        tier="",
        default={"world_size": 4, "pp": 2, "dp_shard": 2},
        alternatives=({"world_size": 8, "pp": 4, "dp_shard": 2},),
        implementation=f"{PIPELINE_WORKLOAD}:zero_bubble",
        workload=dataclasses.replace(PIPELINE_1F1B, schedule="zbv"),
        shapes={**PIPELINE_SHAPES, "global_batch": 16, "n_layers": 8, "stages_per_rank": 2},
        must_be_one=("cp", "tp", "ep"),
        must_exceed_one=("pp",),
    ),
    dict(
        name="P5",
        title="pipeline (DualPipeV) x FSDP",
        description="P4's V placement with ScheduleDualPipeV (DeepSeek-V3's DualPipe cut in half): in the "
        "steady state a rank pairs one stage's forward with the other stage's backward, and the B/W split "
        "fills the warm-up and cool-down; it needs at least as many microbatches as stages (2 pp).",
        matrix_row="P5 | dense | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1, DualPipeV, m >= 2 pp | mini transformer (8 layers)",
        tier="",
        default={"world_size": 4, "pp": 2, "dp_shard": 2},
        alternatives=({"world_size": 8, "pp": 4, "dp_shard": 2},),
        implementation=f"{PIPELINE_WORKLOAD}:dual_pipe_v",
        workload=dataclasses.replace(PIPELINE_1F1B, schedule="dualpipev"),
        shapes={**PIPELINE_SHAPES, "global_batch": 16, "n_layers": 8, "stages_per_rank": 2},
        must_be_one=("cp", "tp", "ep"),
        must_exceed_one=("pp",),
    ),
]
