"""What the rows of the recipe matrix share (``matrix_*.py``): shapes, workload facts, lesson code and calls.

A row's ``shapes`` are the keyword arguments of ``ParallelDims.check_model``: the sizes of the model
its workload builds, so a run is checked against them before any worker starts. Its ``workload`` says
what its implementation builds (``workload_facts``); ``code`` and ``torch_calls`` are what a lesson shows
beside it (launch/notebook/lessons.py). Torch-free.
"""

from hyper_parallel.recipes.workload_facts import WorkloadFacts

MLP_SHAPES = {"global_batch": 16, "hidden_sizes": (32, 64)}
# TransformerConfig defaults: d_model 32, 4 heads, hidden 64, vocab 64, seq_len 16; global batch 8.
TRANSFORMER_SHAPES = {"global_batch": 8, "seq_len": 16, "num_heads": 4, "hidden_sizes": (32, 64, 64)}
SP_SHAPES = {**TRANSFORMER_SHAPES, "sequence_parallel": True}
ASYNC_TP_SHAPES = {**SP_SHAPES, "async_tp": True}  # each rank's sequence shard cut into tp chunks
FLOAT8_SHAPES = {**SP_SHAPES, "float8_dims": (32, 64)}  # the block linears' d_model and hidden: multiples of 16*tp
# MLPConfig: the block linears are 32 <-> 64; each batch row holds seq_len 8 tokens (fixed: no --seq-len).
FLOAT8_MLP_SHAPES = {**MLP_SHAPES, "float8_dims": (32, 64), "row_tokens": 8}
ULYSSES_SHAPES = {**TRANSFORMER_SHAPES, "ulysses": True}  # n_heads % (tp * cp) == 0
SP_ULYSSES_SHAPES = {**SP_SHAPES, "ulysses": True}
# MOE_CONFIG: layer 1 is a MoE with 4 experts of hidden 32, top-2, a shared expert.
MOE_SHAPES = {**SP_SHAPES, "num_experts": 4, "expert_hidden_sizes": (32,)}
# PIPELINE_CONFIG: 4 layers (2 stages of 2, or 4 of 1 interleaved), 4 microbatches per data-parallel rank.
PIPELINE_SHAPES = {**TRANSFORMER_SHAPES, "n_layers": 4, "microbatches": 4}

# The workloads as the cost model's presets name them (cost_model/presets.py); a row that differs says how.
MLP_FSDP = WorkloadFacts("small-mlp")  # recipes/dense.py fsdp_mlp
MLP_DDP = WorkloadFacts("small-mlp", param_shard=False)  # dense.py ddp_mlp
MLP_FSDP_FLOAT8 = WorkloadFacts("small-mlp", float8=True)  # dense.py float8_fsdp_mlp: float8 weight all-gathers
TRANSFORMER = WorkloadFacts("small")  # transformer.py fsdp_transformer: TP+SP / CP as the degrees ask, FSDP
TRANSFORMER_TP = WorkloadFacts("small", param_shard=False, sequence_parallel=False)  # tensor_parallel
MOE = WorkloadFacts("small-moe", moe=True)  # moe.py expert_parallel: all-to-all dispatch
PIPELINE_1F1B = WorkloadFacts(None, sequence_parallel=False, schedule="1f1b")  # pipeline.py: TP without SP

DENSE_WORKLOAD = "hyper_parallel.recipes.transformer"
PIPELINE_WORKLOAD = "hyper_parallel.recipes.pipeline"
MOE_WORKLOAD = "hyper_parallel.recipes.moe"

# The functions a lesson shows beside a recipe's implementation (``Recipe.code``, launch/notebook/lessons.py):
# what that implementation calls to parallelize the model, as "module:function".
MLP_CODE = ("hyper_parallel.recipes.dense:_mlp_workload",)
FLOAT8_CODE = ("hyper_parallel.parallel.float8:convert_to_float8",)
TRANSFORMER_CODE = (f"{DENSE_WORKLOAD}:transformer_workload",)
TP_CODE = (
    "hyper_parallel.parallel.tp:parallelize_transformer_tp",
    "hyper_parallel.parallel.tp:attention_plan",
    "hyper_parallel.parallel.tp:parallelize_dense_block",
)
ASYNC_TP_CODE = (
    "hyper_parallel.parallel.async_tp:parallelize_transformer_async_tp",
    "hyper_parallel.parallel.async_tp:pipelined_all_gather",
    "hyper_parallel.parallel.async_tp:pipelined_reduce_scatter",
)
CP_CODE = (f"{DENSE_WORKLOAD}:apply_context_parallel",)
FSDP_CODE = (f"{DENSE_WORKLOAD}:apply_fully_shard",)
MOE_CODE = (
    f"{MOE_WORKLOAD}:moe_workload",
    f"{MOE_WORKLOAD}:apply_expert_parallel",
    f"{MOE_WORKLOAD}:apply_dual_stack_fully_shard",
)
PIPELINE_CODE = (
    f"{PIPELINE_WORKLOAD}:pipeline_workload",
    f"{PIPELINE_WORKLOAD}:shard_stages",
    "hyper_parallel.parallel.pipeline:split_transformer",
    "hyper_parallel.parallel.pipeline:build_schedule",
)

# The torch calls a lesson puts beside our code (``Recipe.torch_calls``): (our call, what torch offers for it).
FSDP2_CALL = (
    '`fully_shard(unit, mesh=views["dp_replicate", "fsdp"])`',
    '`torch.distributed.fsdp.fully_shard(unit, mesh=mesh["fsdp"])` (a 2-D mesh `(replicate, shard)` makes it HSDP)',
)
FLOAT8_FSDP_CALL = (
    "`convert_to_float8(model, enable_fsdp_float8_all_gather=True)`, then `fully_shard(unit, ...)`",
    "`torchao.float8.convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather="
    "True))`, then `torch.distributed.fsdp.fully_shard(unit)`: FSDP2 calls the weights' `fsdp_pre_all_gather`",
)
DDP_CALL = (
    "`fully_shard(unit, mesh=..., enable_param_shard=False)`",
    "`DistributedDataParallel(model)` / `torch.distributed._composable.replicate(model)`: whole "
    "parameters, one gradient all-reduce",
)
TP_CALL = (
    '`parallelize_transformer_tp(model, views["tp"], ...)`',
    'torch\'s own `parallelize_module(layer, tp_mesh, {"attention.wq": ColwiseParallel(), ..., '
    '"attention.wo": RowwiseParallel()})`, called as is',
)
TP_REPLICAS_CALL = (
    "`fully_shard(..., enable_param_shard=False)`",
    "no torch FSDP2 equivalent: replicas all-reduce, TP-partial gradients are summed over tp",
)
CP_CALL = (
    "`apply_context_parallel(model, views)`",
    "`torch.distributed.tensor.experimental.context_parallel` "
    "(no CPU path in torch, so the workbook has its own attention)",
)
MOE_CALLS = (
    (
        '`parallelize_moe(moe, views["ep"])`',
        "TorchTitan's `ExpertParallel()` style through `parallelize_module(experts, ep_mesh, ExpertParallel())`",
    ),
    (
        '`fully_shard(experts, mesh=views["dp_replicate", "efsdp"])`',
        "`fully_shard(experts, mesh=edp_mesh)` with TorchTitan's dual FSDP meshes",
    ),
)
PIPELINE_CALLS = (
    (
        "`build_schedule('1f1b', stages, microbatches, lm_loss)`",
        "`torch.distributed.pipelining.Schedule1F1B(stage, n_microbatches=m, loss_fn=lm_loss)`, called as is",
    ),
    (
        "`TracedPipelineStage(stage, index, num_stages, device, ...)`",
        "`torch.distributed.pipelining.PipelineStage` (ours records each forward and backward for the figures)",
    ),
    (
        '`fully_shard(layer, mesh=views["dp_replicate", "fsdp"])`',
        "`torch.distributed.fsdp.fully_shard(layer, mesh=dp_mesh)` per stage",
    ),
)
