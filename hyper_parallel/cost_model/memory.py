"""Per-rank memory of one training step: sharded state exactly, activations as a documented estimate.

State kept for the whole run, per unit (``units.Unit``; S = its shard size, the dp_shard group, padding
included), by ZeRO stage (``ModelConfig.zero``) and precision (``model_configs.Precision``):

                 ZeRO-3 (FSDP)            ZeRO-2                  ZeRO-1
    parameters   shard x storage          local x storage         local x storage
    gradients    shard x gradient         shard x gradient        local x gradient
    optimizer    shard x optimizer_state  shard x optimizer_state shard x optimizer_state

("local": the unit's parameters after TP/EP, unsharded; "shard": its flat shard, local / S padded.)
ZeRO (Rajbhandari et al. 2020, section 5) shards the optimizer state (1), the gradients (2) and the
parameters (3) over the data-parallel ranks; dp_replicate keeps whole copies (HSDP's outer dim).

Transient, at the peak of backward:
    ZeRO-3       the root's all-gathered parameters (kept from forward to backward) + the largest other
                 unit's all-gathered parameters (compute bytes) and its unsharded gradients (reduce
                 bytes): FSDP2 reduces one unit at a time; nothing when shard_size is 1 and compute ==
                 storage (they alias). Without reshard_after_forward every unit keeps its gathered
                 parameters from its forward to its backward: all of them are resident.
    ZeRO-1/2     a compute-dtype copy of the parameters when storage differs (FSDP2's float32 master);
                 ZeRO-2's reduce of the largest unit's gradients (its bucket); the copy the stack's
                 reduction makes of all local gradients (``Stack.reduce_copy``: Megatron-DeepSpeed's
                 bfloat16 all-reduce of its float32 buffer). That copy is made after the backward, when the
                 activations are freed, yet it adds to the peak of what the GPU holds: the caching allocator
                 cannot carve one block of the whole buffer from the activations' freed blocks (each one
                 tensor of a layer), so it reserves a new one beside them (torch's reserved memory, which
                 nvidia-smi and torchtitan's max_reserved report)
    pipeline     ``pipelined_gathered_bytes``: torch.distributed.pipelining reduces the gradients of a
                 stage once, after its last microbatch, so every unit's gathered parameters and float32
                 unsharded gradients are resident at the peak (the stack's ``pp_grad_reduce`` "once");
                 stacks that reduce per microbatch keep the parameters gathered and one unit's gradients

Activations saved for backward (a fused attention kernel that keeps only q, k, v, the output and a
logsumexp per row), in elements per token of this rank for one micro-batch (N = B * s tokens, B =
micro_batch rows, s = seq_len / cp; SP divides the residual-stream tensors by tp), times the compute
bytes, without activation checkpointing:
    dense layer  norms' inputs 2 d / sp + the two inputs of the colwise layers: 2 d as the stack's SP
                 keeps them all-gathered (torch's DTensor SP), 2 d / sp re-gathered in backward
                 (Megatron-LM's) + q and the attention output (n_heads x head_dim / tp each) + k, v
                 2 kv (kv = K/V heads per tp rank x head_dim) + the K/V gathered from the other CP ranks
                 2 kv (cp - 1) under all-gather CP unless the stack gathers them again in backward
                 (``Stack.cp_kv_saved``; the ring and Ulysses keep none) + q/k norms' inputs (qk_norm) + feed-forward hidden 2 F / tp (w1 output,
                 activation), gated: the stack's F-wide tensors (4 eager: w1, w3, silu, product; 3 fused)
    scores       stacks without a flash kernel (``Stack.attention_scores`` bytes per score, Megatron-LM's
                 fused softmax and attention dropout): heads / tp x keys per token, unless checkpointed
                 selectively
    embedding    an embedding norm (BLOOM's) keeps its input d / sp per token on the first stage: it sits
                 outside every layer, so no checkpointing covers it (DeepSpeed's PipelineModule checkpoints
                 only the transformer layers)
    MLA          instead of q, k, v: the latent inputs (q_lora_rank x 2, kv_lora_rank x 2 + the rotary
                 key), and q, k (n_heads x head_dim / tp), v and the output (n_heads x v_head_dim / tp)
    MoE layer    the attention part, ffn_norm input d / sp, and per token the MoE sees (1/tp of them
                 under SP with etp == 1) its router input d (none when the stack's fp8 cache recomputes the
                 norm before it), per routed slot (top_k) the row d, hidden 2 F_e / etp (gated: the stack's
                 count) and output d (none when the stack weighs the experts inside the SwiGLU,
                 ``Stack.routing_weights``), and the shared expert d + 2 F_s
    head         logits in float32 for the loss: V * 4 bytes per token once TP has all-gathered them,
                 V / tp * 4 with ``loss_parallel`` (the logits stay sharded over the vocabulary), times
                 the copies alive at the loss's peak (the stack's ``loss_copies``, ``loss_parallel_copies``)
                 for the loss being computed, once (its saved log-softmax) for every other loss whose
                 backward is pending: each other multi-token-prediction module's (its block counted as a
                 layer) and, under GPipe, every other microbatch's
    MLP          per block 2 d + 2 F (norm and w1 inputs, hidden, ReLU output), plus d_in + d_out
Activation checkpointing (``ModelConfig.activation_checkpointing``):
    op           torchtitan's per-op checkpointing (``_save_list`` in its parallelize code): a layer keeps
                 its input d / sp and the outputs of the ops on the list, everything else is recomputed:
                 every other matmul counted from the layer's first (wq, wv, w1 and, gated, w2: q / tp,
                 kv, F / tp, d; plain: wq, wv, w1), the attention output q / tp with its logsumexp (one
                 float32 per head and token: 2 n_heads / tp elements) and, under SP, the two
                 reduce-scatters' outputs 2 d / sp. Float8 linears keep the same (the mm is dispatched
                 as aten.mm before the float8 tensor turns it into a scaled mm; the casts' abs on the
                 list are not counted: torchtitan's float8 peak equals its bfloat16 one, Table 1).
                 MLA attention and MoE layers fall back to the selective estimate
    selective    the attention output (d / tp) and the feed-forward's elementwise results (silu and
                 product: 2 F / tp gated, the activation F / tp plain; the same in experts) are recomputed
    full         every layer keeps only its input (d / sp); one layer's activations (the largest, as
                 without checkpointing) are live again while it is recomputed and backpropagated
It is an estimate for comparing layouts, not a measured peak (allocator slack, temporaries and
communication buffers are not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass

from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.cost_model.stacks import get_stack
from hyper_parallel.cost_model.units import Unit
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes.workload_facts import SequenceScheme


@dataclass(frozen=True)
class Memory:
    """Bytes per rank."""

    parameters: int
    gradients: int
    optimizer: int
    gathered: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.gathered + self.activations

    def as_dict(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "gathered": self.gathered,
            "activations": self.activations,
            "total": self.total,
        }


def state_bytes(units: list[Unit], config: ModelConfig) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer) bytes kept all run (module docstring's table)."""
    p = config.precision
    shard = sum(u.shard_numel for u in units)
    local = shard if config.zero == 3 else sum(u.local_numel for u in units)
    gradients = (local if config.zero == 1 else shard) * p.gradient_bytes
    return local * p.storage, gradients, shard * p.optimizer_state


def _unsharded(unit: Unit, config: ModelConfig) -> int:
    """A unit's all-gathered parameters in the compute dtype, 1 B with float8 all-gathers (0 when they alias
    the stored ones)."""
    precision = config.precision
    if unit.shard_size == 1 and precision.compute == precision.storage:
        return 0
    return unit.gathered_numel * (1 if config.float8 and unit.shard_size > 1 else precision.compute)


def _gathered_bytes(units: list[Unit], config: ModelConfig) -> int:
    """Peak gathered parameters and unsharded gradients (module docstring, "Transient")."""
    precision = config.precision
    if config.zero < 3:
        copy = sum(u.local_numel for u in units) * precision.compute if precision.compute != precision.storage else 0
        bucket = max((u.gathered_numel for u in units), default=0) * precision.reduce if config.zero == 2 else 0
        return copy + bucket + _reduce_copy_bytes(units, config)
    kept = sum(_unsharded(u, config) for u in units if not u.reshard_after_forward)  # the root, or every unit
    others = [
        (0 if not u.reshard_after_forward else _unsharded(u, config)) + u.gathered_numel * precision.reduce
        for u in units
        if not u.is_root
    ]
    return kept + max(others, default=0)


def _reduce_copy_bytes(units: list[Unit], config: ModelConfig) -> int:
    """The copy of every local gradient the stack's data-parallel reduction makes (module docstring, "ZeRO-1/2";
    none without a data-parallel group)."""
    if not any(u.shard_size * u.dp_size > 1 for u in units):
        return 0
    return sum(u.local_numel for u in units) * get_stack(config.stack).reduce_copy


def pipelined_gathered_bytes(units: list[Unit], config: ModelConfig) -> int:
    """A pipeline stage's peak gathered bytes (module docstring, "pipeline"). With the stack's
    ``pp_grad_reduce`` "once" (torch.distributed.pipelining's FSDP handling: ``set_requires_gradient_sync``
    off and ``set_reshard_after_backward`` off until the last microbatch) every unit's parameters are
    gathered and its unsharded gradients accumulate in the reduce dtype (FSDP2's
    ``unsharded_accumulated_grad``); "per_round" keeps the gathered parameters and reduces one unit
    at a time."""
    if config.zero < 3:
        return _gathered_bytes(units, config)
    precision = config.precision
    gathered = sum(_unsharded(u, config) for u in units)
    reduced = [u.gathered_numel * precision.reduce for u in units if u.shard_size > 1]
    if get_stack(config.stack).pp_grad_reduce == "once":
        return gathered + sum(reduced)
    return gathered + max(reduced, default=0)


def _linear_input(config: ModelConfig) -> float:
    """What a saved linear input costs, in compute-dtype elements: half under the stack's fp8 cache."""
    return 0.5 if config.float8 and get_stack(config.stack).fp8_cache else 1.0


def _attention_scores(config: ModelConfig, dims: ParallelDims, selective: bool) -> float:
    """The attention scores a layer keeps per token when the stack's attention is not a flash kernel
    (``Stack.attention_scores`` bytes per score), in compute-dtype elements: heads of the tp rank x keys."""
    score_bytes = get_stack(config.stack).attention_scores
    if selective or not score_bytes:
        return 0.0
    heads = config.n_heads / dims.tp
    return heads * config.attended_keys(-1) * score_bytes / config.precision.compute


def _kv_copies(config: ModelConfig, dims: ParallelDims) -> int:
    """K/V blocks of other cp ranks a layer keeps for backward: all-gather CP keeps the gathered cp - 1 unless
    the stack all-gathers them again in backward (``Stack.cp_kv_saved`` "local"); the ring passes the blocks
    around again in backward and Ulysses attends its heads over the whole sequence, so neither keeps a copy."""
    if config.sequence_scheme != SequenceScheme.ALL_GATHER or get_stack(config.stack).cp_kv_saved == "local":
        return 0
    return dims.cp - 1


def _attention_elements(config: ModelConfig, dims: ParallelDims, selective: bool) -> float:
    """Saved elements per token of one layer's attention, its norm and colwise inputs included."""
    d, tp = config.d_model, dims.tp
    sp = tp if config.uses_sequence_parallel(dims) else 1
    lin = _linear_input(config)
    scores = _attention_scores(config, dims, selective)
    colwise_input = (d if get_stack(config.stack).sp_input == "gathered" else d / sp) * lin
    out = 0 if selective else config.attention_out_dim / tp * (0.75 if lin < 1 else 1)  # DeepSeek's E5M6
    if config.kv_lora_rank:
        latent = (2 * config.q_lora_rank + 2 * config.kv_lora_rank + config.qk_rope_head_dim) * lin
        q = config.head_dim * config.n_heads / tp
        kv = (config.head_dim + config.value_head_dim) * config.n_heads / tp
        recomputed = 0.0 if lin < 1 else q + kv  # the fp8 stack recomputes the up-projections
        return d / sp + colwise_input + latent + recomputed + out + kv * _kv_copies(config, dims) + scores
    kv_dim = config.kv_heads_per_rank(tp) * config.head_dim
    q = config.q_dim / tp
    norms = q + kv_dim if config.qk_norm else 0
    return d / sp + colwise_input + q + out + 2 * kv_dim + 2 * kv_dim * _kv_copies(config, dims) + norms + scores


def _op_checkpointed_elements(config: ModelConfig, dims: ParallelDims) -> float:
    """Elements per token a dense layer keeps under torchtitan's per-op checkpointing (module docstring,
    "op"): its input, every other matmul's output, the attention output and logsumexp, the SP
    reduce-scatters' outputs."""
    d, tp = config.d_model, dims.tp
    sp = tp if config.uses_sequence_parallel(dims) else 1
    kv_dim = config.kv_heads_per_rank(tp) * config.head_dim
    wq, wv, w1 = config.q_dim / tp, kv_dim, config.ffn_hidden / tp
    w2 = d if config.gated_ffn else 0  # the 7th matmul (gated: wq wk wv wo w1 w3 w2); plain has six
    attention = config.q_dim / tp + 2 * config.n_heads / tp + 2 * kv_dim * _kv_copies(config, dims)
    reduce_scatters = 2 * d / sp if sp > 1 else 0
    return d / sp + wq + wv + w1 + w2 + attention + reduce_scatters


def _layer_activation_elements(config: ModelConfig, dims: ParallelDims, layer: int) -> float:
    """Elements saved per token of this rank by one layer (module docstring)."""
    d, tp, etp = config.d_model, dims.tp, dims.etp
    if config.activation_checkpointing == "op" and not config.kv_lora_rank and not config.is_moe_layer(layer):
        return _op_checkpointed_elements(config, dims)
    sp = tp if config.uses_sequence_parallel(dims) else 1
    selective = config.activation_checkpointing in ("selective", "op")
    attention = _attention_elements(config, dims, selective)
    lin = _linear_input(config)
    gated_saved = 2 * lin if lin < 1 else get_stack(config.stack).gated_saved  # fp8: the SwiGLU input only
    hidden_factor = (2 if config.gated_ffn else 1) if selective else (gated_saved if config.gated_ffn else 2)
    colwise_input = (d if get_stack(config.stack).sp_input == "gathered" else d / sp) * lin
    if not config.is_moe_layer(layer):
        return attention + d / sp + colwise_input + hidden_factor * config.ffn_hidden / tp
    expert_output = d if get_stack(config.stack).routing_weights == "output" else 0
    routed = config.top_k * (d * lin + expert_output + hidden_factor * config.moe_hidden / etp)
    shared = (d * lin + hidden_factor * config.shared_expert_hidden) if config.shared_expert_hidden else 0
    router_input = d if lin == 1 else 0  # the fp8 stack recomputes the norm that feeds the router
    moe_tokens = 1 / tp if etp == 1 and sp > 1 else 1  # etp == 1 under SP: the MoE sees the sequence shard
    return attention + d / sp + (router_input + routed + shared) * moe_tokens


def activation_bytes(
    config: ModelConfig,
    dims: ParallelDims,
    layers: tuple[int, ...] | None = None,
    head: bool = True,
    alive: float = 1.0,
    logits_alive: float = 1.0,
    first: bool = True,
) -> int:
    """Saved activations on this rank (module docstring) of ``alive`` micro-batches over ``layers`` (default
    all, the multi-token-prediction blocks included) and ``logits_alive`` micro-batches' float32 logits
    when this rank runs the ``head`` (a pipeline's last stage), an embedding norm's input when it runs the
    embedding (``first``); full checkpointing's recomputed layer is live once whatever the microbatches in
    flight."""
    layers = tuple(range(config.total_layers)) if layers is None else layers
    tokens = config.accumulation(dims)[0] * (config.seq_len // dims.cp)
    a = config.precision.compute
    if config.architecture == "mlp":  # per block: norm input, w1 input, hidden, relu output
        per_token = config.n_layers * (2 * config.d_model + 2 * config.ffn_hidden) + config.d_in + config.d_out
        return int(tokens * per_token * a)
    kinds = {config.is_moe_layer(layer) for layer in layers}
    per_kind = {moe: _layer_activation_elements(config, dims, config.moe_layers[0] if moe else -1) for moe in kinds}
    moe_count = sum(1 for layer in layers if config.is_moe_layer(layer))
    if config.activation_checkpointing == "full":
        sp = dims.tp if config.uses_sequence_parallel(dims) else 1
        saved = alive * len(layers) * config.d_model / sp + max(per_kind.values(), default=0.0)
    else:
        saved = alive * (moe_count * per_kind.get(True, 0.0) + (len(layers) - moe_count) * per_kind.get(False, 0.0))
    if config.embedding_norm and first:
        saved += alive * config.d_model / (dims.tp if config.uses_sequence_parallel(dims) else 1)
    vocab = config.vocab_size / (dims.tp if config.loss_parallel else 1)
    stack = get_stack(config.stack)
    copies = stack.loss_parallel_copies if config.loss_parallel and dims.tp > 1 else stack.loss_copies
    logits = (logits_alive * (1 + config.mtp_layers) - 1 + copies) * vocab * 4 if head else 0
    return int(tokens * (saved * a + logits))


def memory(config: ModelConfig, dims: ParallelDims, units: list[Unit]) -> Memory:
    parameters, gradients, optimizer = state_bytes(units, config)
    return Memory(
        parameters=parameters,
        gradients=gradients,
        optimizer=optimizer,
        gathered=_gathered_bytes(units, config),
        activations=activation_bytes(config, dims),
    )
