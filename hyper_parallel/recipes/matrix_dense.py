"""The dense rows of the recipe matrix (M1-M7): DDP, FSDP, TP, SP, CP (all-gather, ring, Ulysses), HSDP.

Each row is the keyword arguments of ``registry.Recipe``; ``hyper_parallel.recipes.registry`` gathers
the tables in the matrix's order (dense, pipeline, MoE, then the tiers). Rows are plain data so the
tables need not import the registry that gathers them. Torch-free.
"""

from hyper_parallel.recipes.matrix_shapes import (
    ASYNC_TP_CODE,
    ASYNC_TP_SHAPES,
    CP_CALL,
    CP_CODE,
    DDP_CALL,
    FLOAT8_CODE,
    FLOAT8_FSDP_CALL,
    FLOAT8_MLP_SHAPES,
    FLOAT8_SHAPES,
    FSDP2_CALL,
    FSDP_CODE,
    MLP_CODE,
    MLP_DDP,
    MLP_FSDP,
    MLP_FSDP_FLOAT8,
    MLP_SHAPES,
    SP_SHAPES,
    SP_ULYSSES_SHAPES,
    TP_CALL,
    TP_CODE,
    TP_REPLICAS_CALL,
    TRANSFORMER,
    TRANSFORMER_CODE,
    TRANSFORMER_SHAPES,
    TRANSFORMER_TP,
    ULYSSES_SHAPES,
)
from hyper_parallel.recipes.workload_facts import SequenceScheme, WorkloadFacts

DENSE_ROWS: list[dict] = [
    dict(
        name="M1",
        title="DDP through fully_shard(enable_param_shard=False)",
        description="Plain data parallelism: every rank keeps whole parameters and sees a slice of the "
        "global batch; fully_shard with enable_param_shard=False only all-reduces gradients "
        "over the data-parallel group.",
        matrix_row="M1 | dense | TP 1 | SP 0 | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | pure DDP | 2-layer MLP",
        tier="l0",
        default={"world_size": 2, "dp_replicate": 2},  # DDP's replicas, as 01 teaches it
        alternatives=({"world_size": 4, "dp_replicate": 2, "dp_shard": 2},),
        implementation="hyper_parallel.recipes.dense:ddp_mlp",
        workload=MLP_DDP,
        torch_calls=(DDP_CALL,),
        code=MLP_CODE,
        shapes=MLP_SHAPES,
        must_be_one=("cp", "tp", "ep"),
        at_least_one_of=("dp_replicate", "dp_shard"),
    ),
    dict(
        name="M4",
        title="FSDP only",
        description="Parameters, gradients and optimizer state sharded over dp_shard: all-gather before "
        "forward and backward, reduce-scatter of gradients.",
        matrix_row="M4 | dense | TP 1 | SP 0 | CP 1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | FSDP2 only | MLP",
        tier="l0",
        default={"world_size": 2, "dp_shard": 2},
        alternatives=({"world_size": 4, "dp_shard": 4},),
        implementation="hyper_parallel.recipes.dense:fsdp_mlp",
        workload=MLP_FSDP,
        torch_calls=(FSDP2_CALL,),
        plan_command=True,
        code=MLP_CODE,
        shapes=MLP_SHAPES,
        must_be_one=("dp_replicate", "cp", "tp", "ep"),
        must_exceed_one=("dp_shard",),
    ),
    dict(
        name="M4-F8",
        title="FSDP with float8 all-gather",
        description="M4 with the block linears in float8 (torchao Float8Linear, tensorwise dynamic scales, "
        "torch._scaled_mm) and enable_fsdp_float8_all_gather: fully_shard calls each weight's "
        "fsdp_pre_all_gather (FSDP2's tensor-subclass extension), which casts the shard to float8 with the whole "
        "weight's scale (its amax all-reduced over dp_shard) before the all-gather: a quarter of fp32's weight "
        "bytes. Checked against the same model in float8 on one process, and against M4 within a bound derived "
        "from e4m3.",
        matrix_row="M4-F8 | dense | TP 1 | SP 0 | CP 1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | float8 all-gather, dims % 16, tokens per dp rank % 16 | MLP",
        tier="",
        default={"world_size": 2, "dp_shard": 2},
        alternatives=({"world_size": 4, "dp_shard": 4},),
        implementation="hyper_parallel.recipes.dense:float8_fsdp_mlp",
        workload=MLP_FSDP_FLOAT8,
        torch_calls=(FLOAT8_FSDP_CALL, FSDP2_CALL),
        code=MLP_CODE + FLOAT8_CODE,
        shapes=FLOAT8_MLP_SHAPES,
        must_be_one=("dp_replicate", "cp", "tp", "ep"),
        must_exceed_one=("dp_shard",),
    ),
    dict(
        name="M2",
        title="pure tensor parallelism",
        description="Attention and feed-forward split over tp (wq/wk/wv/w1 colwise, wo/w2 rowwise) on "
        "torch's DTensor parallel styles: each rowwise layer all-reduces its output. Data-parallel "
        "replicas, if any, only all-reduce gradients (fully_shard enable_param_shard=False).",
        matrix_row="M2 | dense | TP >1 | SP 0 | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | pure TP | mini transformer",
        tier="l0",
        default={"world_size": 2, "tp": 2},
        alternatives=({"world_size": 4, "tp": 4}, {"world_size": 4, "dp_shard": 2, "tp": 2}),
        implementation="hyper_parallel.recipes.transformer:tensor_parallel",
        workload=TRANSFORMER_TP,
        torch_calls=(TP_CALL, TP_REPLICAS_CALL),
        code=TRANSFORMER_CODE + TP_CODE + FSDP_CODE,
        shapes=TRANSFORMER_SHAPES,
        must_be_one=("cp", "ep"),
        must_exceed_one=("tp",),
    ),
    dict(
        name="M3",
        title="tensor + sequence parallelism",
        description="TP with the residual stream sharded along the sequence between blocks: norms run on "
        "sequence shards, each block's input is all-gathered and its output reduce-scattered. "
        "Norm weights get Partial gradients over tp, which fully_shard sums (notebook 10_pure_tp_fix).",
        matrix_row="M3 | dense | TP >1 | SP 1 | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | TP+SP | mini transformer",
        tier="l1",
        default={"world_size": 2, "tp": 2},
        alternatives=({"world_size": 4, "dp_shard": 2, "tp": 2},),
        implementation="hyper_parallel.recipes.transformer:tensor_sequence_parallel",
        workload=WorkloadFacts("small", param_shard=False, sequence_parallel=True),
        torch_calls=(TP_CALL, TP_REPLICAS_CALL),
        code=TRANSFORMER_CODE + TP_CODE + FSDP_CODE,
        shapes=SP_SHAPES,
        must_be_one=("cp", "ep"),
        must_exceed_one=("tp",),
    ),
    dict(
        name="M3-A",
        title="async tensor + sequence parallelism",
        description="M3 with each block's all-gather and reduce-scatter cut into tp chunks of the sequence "
        "shard, each an async collective, so chunk k's communication runs while another chunk's matmul "
        "computes (torch's fused all-gather-matmul / matmul-reduce-scatter, torchtitan's "
        "enable_async_tensor_parallel). Same numbers and tp bytes as M3.",
        matrix_row="M3-A | dense | TP >1 | SP 1 (async) | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | seq_len % (tp*chunks) | mini transformer",
        tier="",
        default={"world_size": 2, "tp": 2},
        alternatives=({"world_size": 4, "dp_shard": 2, "tp": 2},),
        implementation="hyper_parallel.recipes.transformer:async_tensor_sequence_parallel",
        workload=WorkloadFacts("small", param_shard=False, sequence_parallel=True, async_tp=True),
        torch_calls=(TP_CALL, TP_REPLICAS_CALL),
        code=TRANSFORMER_CODE + ASYNC_TP_CODE + FSDP_CODE,
        shapes=ASYNC_TP_SHAPES,
        must_be_one=("cp", "ep"),
        must_exceed_one=("tp",),
    ),
    dict(
        name="M6-A",
        title="async TP + SP + CP + FSDP",
        description="M6 with async TP inside each block (M3-A's chunked collectives), CP attention and "
        "parameters sharded over fsdp = dp_shard * cp.",
        matrix_row="M6-A | dense | TP >1 | SP 1 (async) | CP >1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | seq_len % (tp*2*cp), shard % chunks | mini transformer",
        tier="",
        default={"world_size": 4, "dp_shard": 1, "cp": 2, "tp": 2},
        alternatives=(),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer_async_tp",
        workload=WorkloadFacts("small", sequence_parallel=True, async_tp=True),
        torch_calls=(TP_CALL, CP_CALL, FSDP2_CALL),
        shapes=ASYNC_TP_SHAPES,
        must_be_one=("ep", "dp_replicate"),
        must_exceed_one=("tp", "cp"),
    ),
    dict(
        name="M3-F8",
        title="TP + SP in float8",
        description="M3 with every block linear in float8 (torchao Float8Linear, tensorwise dynamic scales, "
        "torch._scaled_mm) and each block input cast to float8 before its all-gather over tp (torchao's "
        "Float8ColwiseParallel / Float8RowwiseParallel): a quarter of fp32's gather bytes. Checked against "
        "the same model in float8 on one process, and against M3 within a bound derived from e4m3.",
        matrix_row="M3-F8 | dense | TP >1 | SP 1 | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | float8 tensorwise, dims % 16 | mini transformer",
        tier="",
        default={"world_size": 2, "tp": 2},
        alternatives=({"world_size": 4, "dp_shard": 2, "tp": 2},),
        implementation="hyper_parallel.recipes.transformer:float8_tensor_sequence_parallel",
        workload=WorkloadFacts("small", param_shard=False, sequence_parallel=True, float8=True),
        torch_calls=(TP_CALL, TP_REPLICAS_CALL),
        shapes=FLOAT8_SHAPES,
        must_be_one=("cp", "ep"),
        must_exceed_one=("tp",),
    ),
    dict(
        name="M5",
        title="context parallelism + FSDP",
        description="The sequence split into 2*cp load-balanced chunks; attention all-gathers K/V over cp. "
        "CP ranks also shard parameters: fsdp = dp_shard * cp.",
        matrix_row="M5 | dense | TP 1 | SP 0 | CP >1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | cp in fsdp, seq_len % 2cp | mini transformer",
        tier="l1",
        default={"world_size": 2, "cp": 2, "dp_shard": 1},
        alternatives=({"world_size": 4, "dp_shard": 2, "cp": 2},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer",
        workload=TRANSFORMER,
        torch_calls=(CP_CALL, FSDP2_CALL),
        code=TRANSFORMER_CODE + CP_CODE + FSDP_CODE,
        shapes=TRANSFORMER_SHAPES,
        must_be_one=("tp", "ep", "dp_replicate"),
        must_exceed_one=("cp",),
    ),
    dict(
        name="M6",
        title="TP + SP + CP + FSDP",
        description="Four dense dims at once (TorchTitan llama3): TP+SP inside each block, CP attention, "
        "parameters sharded over fsdp = dp_shard * cp with the TP placement kept.",
        matrix_row="M6 | dense | TP >1 | SP 1 | CP >1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | seq_len % (tp*2*cp) | mini transformer",
        tier="l1",
        default={"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2},
        alternatives=({"world_size": 4, "dp_shard": 1, "cp": 2, "tp": 2},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer",
        workload=TRANSFORMER,
        torch_calls=(TP_CALL, CP_CALL, FSDP2_CALL),
        code=TRANSFORMER_CODE + CP_CODE + TP_CODE + FSDP_CODE,
        shapes=SP_SHAPES,
        must_be_one=("ep", "dp_replicate"),
        must_exceed_one=("tp", "cp"),
    ),
    dict(
        name="M5-R",
        title="ring context parallelism + FSDP",
        description="M5 with K/V passed around the cp ring instead of all-gathered: each attention sends its "
        "K/V block to the next rank asynchronously while it attends to the block in hand (cp-1 steps), "
        "folding each block in by log-sum-exp; backward retraces the ring, dK/dV travelling back with "
        "their blocks. Only two K/V blocks alive, no scores kept. Same tokens per rank and losses as M5.",
        matrix_row="M5-R | dense | TP 1 | SP 0 | CP >1 (ring) | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | M5's dims, ring K/V | mini transformer",
        tier="",
        default={"world_size": 2, "cp": 2, "dp_shard": 1},
        alternatives=({"world_size": 4, "cp": 4},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer_ring",
        code=TRANSFORMER_CODE + CP_CODE + FSDP_CODE,
        workload=WorkloadFacts("small", sequence_scheme=SequenceScheme.RING),
        shapes=TRANSFORMER_SHAPES,
        must_be_one=("tp", "ep", "dp_replicate"),
        must_exceed_one=("cp",),
    ),
    dict(
        name="M5-UR",
        title="2-D sequence parallelism: Ulysses x ring + FSDP",
        description="The sequence split over cp x ulysses ranks (VeOmni's ulysses x cp, USP): 2*cp zig-zag "
        "chunks over the ring, each ring rank's share in ulysses slices. Attention reshards heads over "
        "ulysses by all-to-all (each rank then holds its ring rank's whole share for n_heads/ulysses heads) "
        "and passes those heads' K/V around the cp ring as M5-R does; one more all-to-all turns the output "
        "back. Needs n_heads % ulysses == 0 and seq_len % (2*cp*ulysses) == 0. Same losses as M5.",
        matrix_row="M5-UR | dense | TP 1 | SP 0 | CP >1 (ring) x ulysses >1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | n_heads % ulysses, seq_len % 2 cp ulysses | mini transformer",
        tier="",
        default={"world_size": 4, "cp": 2, "ulysses": 2, "dp_shard": 1},
        alternatives=({"world_size": 8, "cp": 2, "ulysses": 2, "dp_shard": 2},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer_ring",
        code=TRANSFORMER_CODE + CP_CODE + FSDP_CODE,
        workload=WorkloadFacts("small", sequence_scheme=SequenceScheme.RING),
        shapes=TRANSFORMER_SHAPES,
        must_be_one=("tp", "ep", "dp_replicate"),
        must_exceed_one=("cp", "ulysses"),
    ),
    dict(
        name="M5-U",
        title="Ulysses sequence parallelism + FSDP",
        description="The sequence sharded over cp as in M5, but attention reshards by heads: one all-to-all "
        "turns q/k/v sequence shards into head shards (each rank attends over the whole sequence "
        "with n_heads/cp heads), one more turns the output back; backward mirrors both. Needs "
        "n_heads % cp == 0. Same losses as M5.",
        matrix_row="M5-U | dense | TP 1 | SP 0 | CP >1 (Ulysses) | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | n_heads % cp, seq_len % 2cp | mini transformer",
        tier="",
        default={"world_size": 2, "cp": 2, "dp_shard": 1},
        alternatives=({"world_size": 4, "cp": 4},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer_ulysses",
        workload=WorkloadFacts("small", sequence_scheme=SequenceScheme.ULYSSES),
        shapes=ULYSSES_SHAPES,
        must_be_one=("tp", "ep", "dp_replicate"),
        must_exceed_one=("cp",),
    ),
    dict(
        name="M6-U",
        title="TP + SP + Ulysses + FSDP",
        description="M6 with Ulysses attention on the cp ranks: TP splits the heads by tp, Ulysses splits "
        "each tp rank's heads again by cp (n_heads % (tp*cp) == 0).",
        matrix_row="M6-U | dense | TP >1 | SP 1 | CP >1 (Ulysses) | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | n_heads % (tp*cp), seq_len % (tp*2*cp) | mini transformer",
        tier="",
        default={"world_size": 4, "dp_shard": 1, "cp": 2, "tp": 2},
        alternatives=({"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer_ulysses",
        workload=WorkloadFacts("small", sequence_scheme=SequenceScheme.ULYSSES),
        shapes=SP_ULYSSES_SHAPES,
        must_be_one=("ep", "dp_replicate"),
        must_exceed_one=("tp", "cp"),
    ),
    dict(
        name="M7",
        title="HSDP (dp_replicate x fsdp), TP/CP optional",
        description="Parameters sharded within each replica group and replicated across groups: gradients "
        "reduce-scatter over fsdp, then all-reduce over dp_replicate.",
        matrix_row="M7 | dense | TP >1 | SP 0..1 | CP 1..>1 | FSDP2 >0 | dp_rep 1 | EP 0 | ETP 0 | HSDP | mini transformer",
        tier="l1",
        default={"world_size": 4, "dp_replicate": 2, "dp_shard": 2},
        alternatives=({"world_size": 8, "dp_replicate": 2, "dp_shard": 2, "tp": 2},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer",
        workload=TRANSFORMER,
        torch_calls=(FSDP2_CALL,),
        code=TRANSFORMER_CODE + FSDP_CODE,
        shapes=SP_SHAPES,
        must_be_one=("ep",),
        must_exceed_one=("dp_replicate",),
        at_least_one_of=("dp_shard", "cp"),
    ),
]
