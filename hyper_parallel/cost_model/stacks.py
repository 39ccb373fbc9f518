"""Training stacks: what the same layout costs differently in torchtitan, Megatron-LM or DeepSpeed.

A published run is costed by what its stack does, not by a factor fitted to the run: each field below
is a behaviour of the stack's code or stated by its authors, and the cost model reads it where that
behaviour changes memory or time (``memory``, ``work``, ``step_time``, ``stages``).

    sp_input        what a column-parallel layer saves for its backward under sequence parallelism:
                    "gathered" (torch's DTensor SP: the all-gathered input, full width) or "sharded"
                    (Megatron-LM's SP, Korthikanti et al. 2022: the sequence shard, all-gathered again in
                    backward)
    gated_saved     F-wide tensors a SwiGLU feed-forward saves per token: 4 eagerly (w1 and w3 outputs,
                    silu, their product; torchtitan's ``w2(F.silu(w1(x)) * w3(x))``), 3 when a fused
                    kernel recomputes silu in backward (Megatron-LM's ``bias_swiglu``)
    elementwise     "eager" (one kernel per op: norms, residuals, rotary, activations read and write HBM
                    each) or "fused" (torch.compile, Megatron's fused kernels): memory-bound traffic
                    halved (``work``)
    pp_grad_reduce  with FSDP/ZeRO-3 under a pipeline: "once" (torch.distributed.pipelining's FSDP
                    handling: gradients reduced after the last microbatch, unsharded parameters and
                    float32 gradients of the whole stage held all step) or "per_round" (parameters
                    gathered and gradients reduce-scattered in float32 once per round of the schedule's
                    microbatches on a stage, so a stage holds one chunk's unsharded gradients: Llama 3's
                    FSDP, section 3.3.2, which shards gradients and does not reshard after forward)
    dp_overlap      the data-parallel gradient reduction overlaps the backward (FSDP2, DeepSpeed, Megatron-LM
                    since overlap_grad_reduce) or runs after it (Megatron-LM's DDP of 2021)
    zero3_prefetch  ZeRO-3 / FSDP all-gathers issued ahead of the layer that needs them: 1 (FSDP2's implicit
                    prefetch of the next unit), 0 (fetched on demand: DeepSpeed's ZeRO-3 at the start of
                    each module when its prefetch bucket is exhausted, Narayanan et al. 2021 Table 2)
    optimizer_gather the ZeRO-1/2 all-gather of the updated parameters after the optimizer step:
                    "exposed" (DeepSpeed's ZeRO-1/2: after the step, nothing to overlap) or "hidden"
                    (Megatron's distributed optimizer overlaps it with the next forward)
    fp8_cache       with float8 linears, what a linear saves for its backward (its input) and a SwiGLU's input
                    are cached in float8 (1 B), the SwiGLU output and MLA's up-projections and norms are
                    recomputed (DeepSeek-V3 report, sections 3.2.3 and 3.3.3)
    loss_copies     float32 logits-sized tensors alive at the peak of the loss (its backward): torch's
                    fused cross_entropy on ``logits.float()`` (torchtitan's loss) holds 3, the saved
                    log-softmax, its gradient and the input gradient; 1 for Megatron-LM's vocab-parallel
                    cross entropy, which works in place on the float32 logits (softmax kept, gradient
                    written over it). Meta's and DeepSeek's stacks are taken as Megatron's
    loss_parallel_copies  the same under ``loss_parallel``: torch's DTensor decomposition of the loss
                    (torch.distributed.tensor.parallel.loss) holds 4 in its backward: the saved
                    log-softmax, the zeros it scatters the targets into, exp of the log-softmax and their sum
    pp_outputs_kept under a pipeline, the stage outputs the schedule keeps: "all" (torch.distributed.pipelining
                    before pytorch/pytorch#153383, May 2025: every stage appends every microbatch's output to
                    ``output_chunks``, released when the next step starts; the last stage's are the logits as
                    the head emits them) or "none" (Megatron-LM frees an output's data once sent, DeepSpeed's
                    pipeline engine keeps a 1/tp partition of it: not counted)
    attention_scores bytes a layer saves per attention score (query x key, per head of the tp rank) when the
                    attention is not a fused flash kernel: 0 (flash attention: the scores never leave the
                    kernel) or 5 (Megatron-LM of 2021 and Megatron-DeepSpeed of 2022: the fused scale-mask-
                    softmax keeps its bf16 output, the attention dropout (0.1, Megatron's default) its 1 B
                    mask and bf16 output); selective checkpointing recomputes them. The ZeRO-3 baseline
                    of Narayanan et al. keeps 0: its attention kernel is not stated
    zero3_calls     how a ZeRO-3 unit's collectives are issued: "unit" (FSDP2: one all-gather and one reduce-scatter
                    per unit and pass) or "module" (DeepSpeed's ZeRO-3 of April 2021, 112ebff:
                    ``fetch_sub_module`` all-gathers each module's own parameters in one call,
                    ``_reduce_scatter_gradients`` reduce-scatters every parameter's gradient in its own call;
                    Megatron's fused query_key_value counted as one module)
    reduce_copy     bytes per element of a copy the stack's data-parallel reduction makes of the gradients after
                    the backward: 0 (the reduction works on the buffer the gradients accumulate in) or 2
                    (Megatron-DeepSpeed of 2022: DeepSpeed's pipeline engine all-reduces BF16_Optimizer's
                    float32 gradient buffer in ``communication_data_type``, bfloat16 by default with bf16 on
                    from DeepSpeed #1487, Nov 2021, to #2970, Mar 2023; ``allreduce_bucket`` casts the flat
                    buffer of a parameter group, nearly every weight of the stage, to it in one tensor: a
                    5e8-element bucket closes on the first tensor that overflows it)
    cp_kv_saved     under all-gather context parallelism (``SequenceScheme.ALL_GATHER``), the K/V a layer keeps for
                    its backward: "gathered" (an autograd all-gather before the attention, the workbook's: the
                    K/V of every cp rank are saved, the backward reduce-scatters their gradient) or "local" (the
                    rank's own K/V, all-gathered again in backward: TransformerEngine's
                    ``AttnFuncWithCPAndKVAllGather``, written after the Llama 3 paper's section 3.3.2)
    routing_weights where a routed expert's weight multiplies its output: "output" (the combine weighs each
                    expert's output, which is kept for the weight's gradient) or "swiglu" (inside the fused
                    SwiGLU, whose output is recomputed in backward from its cached input, so no expert output
                    is kept: Megatron-Core's ``weighted_bias_swiglu_impl`` with ``activation_func_fp8_input_store``)
    parallelisms    the degrees the stack can run above 1: ``--compare`` ranks only those layouts (a
                    team on Megatron-LM of 2021 chose among TP, PP and DDP, not FSDP or CP)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stack:
    name: str
    description: str
    sp_input: str = "gathered"
    gated_saved: int = 4
    elementwise: str = "eager"
    pp_grad_reduce: str = "once"
    dp_overlap: bool = True
    zero3_prefetch: int = 1
    optimizer_gather: str = "exposed"
    fp8_cache: bool = False
    loss_copies: int = 1
    loss_parallel_copies: int = 1
    pp_outputs_kept: str = "none"
    attention_scores: int = 0
    reduce_copy: int = 0
    zero3_calls: str = "unit"
    cp_kv_saved: str = "gathered"
    routing_weights: str = "output"
    parallelisms: tuple[str, ...] = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp")

    def runs(self, degrees: dict[str, int]) -> bool:
        """Whether the stack has every parallelism ``degrees`` uses (a degree above 1)."""
        return all(value == 1 or name in self.parallelisms for name, value in degrees.items() if name != "world_size")


STACK_LIST = (
    Stack(
        "torchtitan",
        "torchtitan: FSDP2, DTensor TP/SP, torch.distributed.pipelining, eager kernels",
        loss_copies=3,
        loss_parallel_copies=4,
        pp_outputs_kept="all",
    ),
    Stack(
        "torchtitan-compile",
        "torchtitan with torch.compile: as torchtitan, elementwise ops fused per layer (the loss stays eager)",
        elementwise="fused",
        loss_copies=3,
        loss_parallel_copies=4,
        pp_outputs_kept="all",
    ),
    Stack(
        "megatron",
        "Megatron-LM (Narayanan et al. 2021): fused kernels, DDP gradient all-reduce after the backward",
        sp_input="sharded",
        gated_saved=3,
        elementwise="fused",
        pp_grad_reduce="per_round",
        dp_overlap=False,
        optimizer_gather="hidden",
        attention_scores=5,
        parallelisms=("dp_replicate", "tp", "pp"),
    ),
    Stack(
        "megatron-deepspeed",
        "Megatron-DeepSpeed (BigScience's BLOOM): Megatron's kernels, DeepSpeed's pipeline and ZeRO-1 bf16 "
        "optimizer (gradients reduced after the backward, parameters all-gathered after the step)",
        sp_input="sharded",
        gated_saved=3,
        elementwise="fused",
        pp_grad_reduce="per_round",
        dp_overlap=False,
        attention_scores=5,
        reduce_copy=2,
        parallelisms=("dp_shard", "tp", "pp"),
    ),
    Stack(
        "deepspeed-zero3",
        "DeepSpeed ZeRO-3 (Narayanan et al. 2021, Table 2): parameters fetched as each module starts",
        elementwise="fused",
        zero3_prefetch=0,
        zero3_calls="module",
        parallelisms=("dp_replicate", "dp_shard", "tp", "pp"),
    ),
    Stack(
        "llama3",
        "Meta's Llama 3 stack (section 3.3.2): FSDP sharding gradients and optimizer state, parameters kept "
        "gathered, Megatron-style TP/SP and fused kernels, asynchronous P2P, all-gather CP re-gathering K/V in backward",
        sp_input="sharded",
        gated_saved=3,
        elementwise="fused",
        pp_grad_reduce="per_round",
        cp_kv_saved="local",
        parallelisms=("dp_shard", "cp", "tp", "pp"),
    ),
    Stack(
        "hai-llm",
        "DeepSeek's HAI-LLM (DeepSeek-V3 report, section 3.2): ZeRO-1, DualPipe, fused FP8 kernels, RMSNorm and "
        "MLA up-projections recomputed, routing weights applied in the recomputed SwiGLU",
        sp_input="sharded",
        gated_saved=3,
        elementwise="fused",
        pp_grad_reduce="per_round",
        optimizer_gather="hidden",
        fp8_cache=True,
        routing_weights="swiglu",
        parallelisms=("dp_shard", "pp", "ep"),
    ),
)
STACKS = {s.name: s for s in STACK_LIST}


def get_stack(name: str) -> Stack:
    if name not in STACKS:
        raise ValueError(f"unknown stack {name!r}; known: {', '.join(STACKS)}")
    return STACKS[name]
