"""The model shapes and workload modules the rows of the recipe matrix share (``matrix_*.py``).

A row's ``shapes`` are the keyword arguments of ``ParallelDims.check_model``: the sizes of the model
its workload builds, so a run is checked against them before any worker starts. Torch-free.
"""

MLP_SHAPES = {"global_batch": 16, "hidden_sizes": (32, 64)}
# TransformerConfig defaults: d_model 32, 4 heads, hidden 64, vocab 64, seq_len 16; global batch 8.
TRANSFORMER_SHAPES = {"global_batch": 8, "seq_len": 16, "num_heads": 4, "hidden_sizes": (32, 64, 64)}
SP_SHAPES = {**TRANSFORMER_SHAPES, "sequence_parallel": True}
ASYNC_TP_SHAPES = {**SP_SHAPES, "async_tp": True}  # each rank's sequence shard cut into tp chunks
FLOAT8_SHAPES = {**SP_SHAPES, "float8_dims": (32, 64)}  # the block linears' d_model and hidden: multiples of 16*tp
ULYSSES_SHAPES = {**TRANSFORMER_SHAPES, "ulysses": True}  # n_heads % (tp * cp) == 0
SP_ULYSSES_SHAPES = {**SP_SHAPES, "ulysses": True}
# MOE_CONFIG: layer 1 is a MoE with 4 experts of hidden 32, top-2, a shared expert.
MOE_SHAPES = {**SP_SHAPES, "num_experts": 4, "expert_hidden_sizes": (32,)}
# PIPELINE_CONFIG: 4 layers (2 stages of 2, or 4 of 1 interleaved), 4 microbatches per data-parallel rank.
PIPELINE_SHAPES = {**TRANSFORMER_SHAPES, "n_layers": 4, "microbatches": 4}

DENSE_WORKLOAD = "hyper_parallel.recipes.transformer"
PIPELINE_WORKLOAD = "hyper_parallel.recipes.pipeline"
MOE_WORKLOAD = "hyper_parallel.recipes.moe"

# The functions a lesson shows beside a recipe's implementation (``Recipe.code``, launch/notebook/lessons.py):
# what that implementation calls to parallelize the model, as "module:function".
MLP_CODE = ("hyper_parallel.recipes.dense:_mlp_workload",)
TRANSFORMER_CODE = (f"{DENSE_WORKLOAD}:transformer_workload",)
TP_CODE = ("hyper_parallel.parallel.tp:parallelize_transformer_tp",)
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
    "hyper_parallel.parallel.pipeline:split_transformer",
    "hyper_parallel.parallel.pipeline:build_schedule",
)
