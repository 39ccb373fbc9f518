"""The models the cost model describes: shapes, parallel style and precision, as plain data (no torch).

The presets (``presets.PRESETS``: the recipes' tiny models, and models at scale read from Hugging Face
``config.json`` files in ``configs/`` by ``ModelConfig.from_hf_config``) are data built from this class.

Precision (``PRECISIONS``): the recipes train in float32 with SGD (no optimizer state); the presets at
scale assume the usual mixed precision: float32 master parameters and gradients in the sharded storage,
bfloat16 all-gathers and activations (``MixedPrecisionPolicy.param_dtype``), float32 gradient
reduction (``reduce_dtype``), Adam with two float32 states per parameter.

Training knobs (fields of ``ModelConfig``, so ``estimate`` and every planner view honour them):

    micro_batch / grad_accum   rows per rank per forward, and forwards per step: global_batch =
                               dp * micro_batch * grad_accum (give one, the other is derived per layout;
                               neither: one micro-batch of global_batch / dp rows)
    activation_checkpointing   "none", "op" (torchtitan's per-op selective checkpointing: every other matmul
                               and the elementwise ops recomputed), "selective" (Megatron's: recompute the
                               attention core; the estimate also drops the feed-forward's
                               elementwise ops) or "full" (keep each layer's input, recompute the layer)
    loss_parallel              TP keeps the logits sharded over the vocabulary: no logits all-gather,
                               three all-reduces of one float32 per token instead (max, sum of exp, target)
    reshard_after_forward      False: every unit keeps its all-gathered parameters until its backward
                               (one all-gather per unit per micro-batch, more memory)
    expert_shard_dim           the axis of the expert tensors [E, d, h] FSDP shards (0: experts, padded to
                               the shard size; 1 or 2: inside every expert, as FSDP2's ``shard_placement_fn``
                               allows; the workbook's fully_shard shards the first unsplit axis, 0)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hyper_parallel.cost_model import hf_config
from hyper_parallel.cost_model.pipeline import SCHEDULES, get_schedule, stage_layer_counts
from hyper_parallel.cost_model.stacks import STACKS
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes.workload_facts import SequenceScheme

INT64_BYTES = 8
"""EP exchanges its per-expert token counts as int64."""
AC_MODES = ("none", "op", "selective", "full")
PP_SCHEDULES = SCHEDULES
ZERO_STAGES = (1, 2, 3)


@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a rank stores and sends."""

    name: str
    storage: int  # the parameters kept between steps (FSDP2: the float32 master; Megatron: bfloat16)
    compute: int  # all-gathered parameters and activations (param_dtype)
    reduce: int  # gradient reduce-scatter / all-reduce (reduce_dtype)
    optimizer_state: int  # per parameter element (SGD 0, Adam m and v in float32: 8, plus a float32 master: 12)
    gradient: int = 0  # the gradient buffer (0: as storage; Megatron's float32 main_grad: 4)
    description: str = ""

    @property
    def gradient_bytes(self) -> int:
        return self.gradient or self.storage


PRECISIONS = {
    p.name: p
    for p in [
        Precision("fp32-sgd", storage=4, compute=4, reduce=4, optimizer_state=0, description="float32, SGD"),
        Precision("fp32-adam", storage=4, compute=4, reduce=4, optimizer_state=8, description="float32, Adam"),
        Precision(
            "bf16-adam",
            storage=4,
            compute=2,
            reduce=4,
            optimizer_state=8,
            description="FSDP2 mixed precision: float32 parameters and gradients, bfloat16 all-gathers and "
            "activations, float32 reduction, Adam m and v in float32 (16 B per parameter)",
        ),
        Precision(
            "bf16-master",
            storage=2,
            compute=2,
            reduce=4,
            optimizer_state=12,
            gradient=4,
            description="Megatron-LM / DeepSpeed mixed precision: bfloat16 parameters, float32 main gradients "
            "reduced in float32, the optimizer's float32 master copy and Adam m and v (18 B per parameter)",
        ),
        Precision(
            "bf16-deepspeed",
            storage=2,
            compute=2,
            reduce=4,
            optimizer_state=12,
            gradient=6,
            description="DeepSpeed's BF16_Optimizer (Megatron-DeepSpeed, BLOOM): bfloat16 parameters and gradients, "
            "an unsharded float32 buffer the gradients accumulate in (bigscience tr11-176B-ml README), the float32 "
            "master copy and Adam m and v",
        ),
        Precision(
            "fp8-deepseek",
            storage=2,
            compute=2,
            reduce=4,
            optimizer_state=8,
            gradient=4,
            description="DeepSeek-V3's FP8 framework (report section 3.3.3): bfloat16 parameters, float32 gradients "
            "and master copy, Adam m and v in bfloat16",
        ),
        Precision(
            "fp16-master",
            storage=2,
            compute=2,
            reduce=2,
            optimizer_state=12,
            description="ZeRO's mixed precision (Rajbhandari et al. 2020, section 3.1): fp16 parameters and "
            "gradients, float32 master copy and Adam m and v (16 B per parameter)",
        ),
    ]
}


@dataclass(frozen=True)
class ModelConfig:
    """Shapes, parallel style and precision of one model.

    ``global_batch`` is fixed per model (not per rank), so layouts of one world size are compared on the
    same step. ``sequence_parallel`` None turns SP on whenever tp > 1 (TorchTitan, the recipes' default);
    ``param_shard`` is fully_shard's ``enable_param_shard`` (False: DDP / pure-TP compat, no sharding).
    ``dispatch`` is EP's token exchange, "all_to_all" or "all_gather" (recipe S3).
    """

    name: str
    architecture: str = "transformer"  # or "mlp" (the M1/M4 residual MLP)
    vocab_size: int = 64
    d_model: int = 32
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: as many as n_heads (no GQA)
    n_layers: int = 2
    ffn_hidden: int = 64
    gated_ffn: bool = False  # SwiGLU (w1, w3, w2) instead of w2(silu(w1 x))
    seq_len: int = 16
    global_batch: int = 8
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 1
    top_k: int = 1
    moe_hidden: int = 0
    shared_expert_hidden: int = 0  # 0: no shared expert
    d_in: int = 0  # MLP only
    d_out: int = 0  # MLP only
    sequence_parallel: bool | None = None
    param_shard: bool | None = None
    dispatch: str = "all_to_all"
    sequence_scheme: SequenceScheme = SequenceScheme.ALL_GATHER  # cp attention: K/V all-gather, K/V ring, Ulysses
    precision: Precision = PRECISIONS["fp32-sgd"]
    description: str = ""  # the architecture; ``describe()`` adds the step's shape
    micro_batch: int | None = None
    grad_accum: int | None = None
    activation_checkpointing: str = "none"  # none, op, selective, full
    loss_parallel: bool = False
    reshard_after_forward: bool = True
    expert_shard_dim: int = 0
    attention_bias: bool = False  # q, k, v projections have biases (Qwen2)
    linear_bias: bool = False  # every linear and norm has a bias (GPT-2's Conv1D and LayerNorm)
    tied_embeddings: bool = False  # the head reuses the embedding table (GPT-2, small Qwen2)
    position_embeddings: int = 0  # rows of a learned position table (GPT-2 n_positions); 0: rotary
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate [1, d] on the shared expert
    pp_schedule: str = "1f1b"  # a name of cost_model.pipeline.SCHEDULES
    virtual_stages: int = 1  # stages per pp rank (interleaved: >= 2; zbv, dualpipev: 2)
    stage_layers: tuple[int, ...] | None = None  # layers of each of the pp x virtual_stages stages (None: split)
    zero: int = 3  # ZeRO stage over dp_shard: 3 shards parameters (FSDP), 2 gradients and optimizer, 1 optimizer
    float8: bool = False  # tensorwise float8 linears: the layers' GEMMs at the fp8 peak, float8 all-gathers
    async_tp: bool = False  # TP's all-gather / reduce-scatter overlapped with the matmuls (async TP)
    stack: str = "torchtitan"  # the training stack's habits (cost_model.stacks)
    attention_head_dim: int = 0  # 0: d_model / n_heads (Qwen3 and Gemma set their own)
    qk_norm: bool = False  # RMSNorm on every query and key head (Qwen3, OLMo 2)
    sliding_window: int = 0  # keys each query sees (Mistral); 0: the whole (causal) sequence
    sliding_layers: tuple[int, ...] | None = None  # the windowed layers (None: all of them when sliding_window)
    q_lora_rank: int = 0  # multi-head latent attention (DeepSeek-V2/V3): query down-projection rank (0: none)
    kv_lora_rank: int = 0  # MLA's compressed K/V dimension; 0: standard attention
    qk_rope_head_dim: int = 0  # MLA: the decoupled rotary part of each query/key head
    qk_nope_head_dim: int = 0  # MLA: the non-rotary part of each query/key head
    v_head_dim: int = 0  # MLA: each value head
    mtp_layers: int = 0  # multi-token prediction modules (DeepSeek-V3's num_nextn_predict_layers)
    ep_node_limit: int = 0  # node-limited routing: a token reaches at most this many nodes' experts (0: any)
    embedding_norm: bool = False  # a norm right after the embedding (BLOOM's word_embeddings_layernorm)
    notes: tuple[str, ...] = ()  # what reading the model's config did not model (shown with every plan)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "seq_len", "global_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}; nearest valid {name}: 1")
        for name in ("ffn_hidden", "moe_hidden", "shared_expert_hidden", "position_embeddings"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}; nearest valid {name}: 0")
        schedule = get_schedule(self.pp_schedule)
        if self.virtual_stages < 1:
            raise ValueError(f"virtual_stages must be >= 1, got {self.virtual_stages}; nearest valid virtual_stages: 1")
        schedule.check_stages(self.virtual_stages)
        if self.zero not in ZERO_STAGES:
            raise ValueError(f"zero must be 1, 2 or 3 (the ZeRO stage over dp_shard), got {self.zero!r}")
        if self.stack not in STACKS:
            raise ValueError(f"stack must be one of {', '.join(STACKS)}, got {self.stack!r}")
        for name in ("sliding_window", "attention_head_dim", "mtp_layers", "ep_node_limit", "kv_lora_rank"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}; nearest valid {name}: 0")
        if self.kv_lora_rank and not (self.qk_rope_head_dim + self.qk_nope_head_dim and self.v_head_dim):
            raise ValueError(
                "multi-head latent attention (kv_lora_rank > 0) needs qk_rope_head_dim + qk_nope_head_dim > 0 and "
                f"v_head_dim > 0, got {self.qk_rope_head_dim}, {self.qk_nope_head_dim}, {self.v_head_dim}"
            )
        if self.architecture not in ("transformer", "mlp"):
            raise ValueError(f"architecture must be 'transformer' or 'mlp', got {self.architecture!r}")
        if self.dispatch not in ("all_to_all", "all_gather"):
            raise ValueError(f"dispatch must be 'all_to_all' or 'all_gather', got {self.dispatch!r}")
        if self.sequence_scheme not in tuple(SequenceScheme):
            raise ValueError(
                f"sequence_scheme must be one of {[s.value for s in SequenceScheme]}, got {self.sequence_scheme!r}"
            )
        object.__setattr__(self, "sequence_scheme", SequenceScheme(self.sequence_scheme))
        if self.activation_checkpointing not in AC_MODES:
            raise ValueError(
                f"activation_checkpointing must be one of {', '.join(AC_MODES)}, got {self.activation_checkpointing!r}"
            )
        if self.expert_shard_dim not in (0, 1, 2):
            raise ValueError(
                f"expert_shard_dim must be 0 (experts), 1 or 2 (inside each expert [E, d, h]), "
                f"got {self.expert_shard_dim}"
            )
        if self.moe_layers and self.num_experts < 1:
            raise ValueError(f"num_experts must be >= 1 in a model with MoE layers, got {self.num_experts}")
        if self.moe_layers and not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"top_k={self.top_k} must be between 1 and num_experts={self.num_experts} (each token goes to top_k "
                f"distinct experts); nearest valid top_k: {min(max(self.top_k, 1), self.num_experts)}"
            )
        for name in ("micro_batch", "grad_accum"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}; nearest valid {name}: 1")
        if self.architecture == "transformer" and (
            (self.d_model % self.n_heads and not self.attention_head_dim) or self.n_heads % self.kv_heads
        ):
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads} (or attention_head_dim given), "
                f"and n_heads by n_kv_heads={self.kv_heads}"
            )

    @classmethod
    def from_hf_config(cls, config: dict, name: str | None = None, **training) -> ModelConfig:
        """The model a Hugging Face ``config.json`` (parsed) describes; ``training`` keywords (``seq_len``,
        ``global_batch``, ``precision``, knobs) replace the defaults ``hf_config.model_fields`` documents."""
        fields = hf_config.model_fields(config)
        if "precision" in fields:
            fields["precision"] = PRECISIONS[fields["precision"]]
        if name:
            fields["name"] = name
        return cls(**(fields | training))

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        """Per head of queries and keys (MLA: the non-rotary plus the rotary part)."""
        if self.kv_lora_rank:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.attention_head_dim or self.d_model // self.n_heads

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.kv_lora_rank else self.head_dim

    @property
    def q_dim(self) -> int:
        """Query features of all heads (d_model unless head_dim is set apart from it)."""
        return self.n_heads * self.head_dim

    @property
    def attention_out_dim(self) -> int:
        """The attention output (input of wo) of all heads."""
        return self.n_heads * self.value_head_dim

    def attended_keys(self, layer: int) -> int:
        """Keys each query attends to in ``layer``: the sequence, or the sliding window where it applies."""
        windowed = self.sliding_window and (self.sliding_layers is None or layer in self.sliding_layers)
        return min(self.seq_len, self.sliding_window) if windowed else self.seq_len

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layers)

    def is_moe_layer(self, layer: int) -> bool:
        """Layers n_layers.. are the multi-token-prediction modules' blocks, of the last layer's kind."""
        return layer in self.moe_layers or (layer >= self.n_layers and self.n_layers - 1 in self.moe_layers)

    @property
    def total_layers(self) -> int:
        """Transformer blocks with the multi-token-prediction modules' (numbered after the last layer)."""
        return self.n_layers + self.mtp_layers

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """The architecture and this step's shape, from the fields (overrides included)."""
        knobs = [f"seq_len {self.seq_len}", f"global batch {self.global_batch}", f"precision {self.precision.name}"]
        knobs += [f"micro-batch {self.micro_batch}"] if self.micro_batch else []
        knobs += [f"grad-accum {self.grad_accum}"] if self.grad_accum else []
        knobs += [f"AC {self.activation_checkpointing}"] if self.activation_checkpointing != "none" else []
        knobs += ["loss parallel"] if self.loss_parallel else []
        knobs += ["no reshard after forward"] if not self.reshard_after_forward else []
        knobs += [f"experts sharded on dim {self.expert_shard_dim}"] if self.expert_shard_dim else []
        knobs += [f"ZeRO-{self.zero}"] if self.zero != 3 else []
        knobs += ["float8 linears"] if self.float8 else []
        knobs += ["async TP"] if self.async_tp else []
        knobs += [f"stack {self.stack}"] if self.stack != "torchtitan" else []
        if self.pp_schedule != "1f1b" or self.virtual_stages > 1:
            knobs.append(f"{self.pp_schedule} x {self.virtual_stages} stage(s) per rank")
        if self.stage_layers:
            knobs.append("stage layers " + ",".join(map(str, self.stage_layers)))
        return f"{self.description}; " + ", ".join(knobs) if self.description else ", ".join(knobs)

    def accumulation(self, dims: ParallelDims) -> tuple[int, int]:
        """(micro_batch, grad_accum) on ``dims``: rows per rank per forward and forwards per step, with
        dp * micro_batch * grad_accum == global_batch; ``ValueError`` when they do not divide."""
        rows = self.global_batch // max(dims.dp, 1)
        if self.micro_batch is None and self.grad_accum is None:
            return rows, 1
        if self.micro_batch is not None and self.grad_accum is not None:
            if dims.dp * self.micro_batch * self.grad_accum != self.global_batch:
                raise ValueError(
                    f"dp={dims.dp} x micro_batch={self.micro_batch} x grad_accum={self.grad_accum} "
                    f"!= global_batch={self.global_batch}; give one of them, or a matching batch"
                )
            return self.micro_batch, self.grad_accum
        if self.micro_batch is not None:
            if rows % self.micro_batch:
                raise ValueError(
                    f"micro_batch={self.micro_batch} must divide the {rows} rows per rank "
                    f"(global_batch={self.global_batch} / dp={dims.dp})"
                )
            return self.micro_batch, rows // self.micro_batch
        if rows % self.grad_accum:
            raise ValueError(
                f"grad_accum={self.grad_accum} must divide the {rows} rows per rank "
                f"(global_batch={self.global_batch} / dp={dims.dp})"
            )
        return rows // self.grad_accum, self.grad_accum

    def uses_sequence_parallel(self, dims: ParallelDims) -> bool:
        return dims.tp > 1 and self.sequence_parallel is not False

    def kv_heads_per_rank(self, tp: int) -> int:
        """K/V heads a tp rank holds: kv_heads / tp, or one replicated head when tp > kv_heads."""
        return max(1, self.kv_heads // tp)

    def check(self, dims: ParallelDims) -> None:
        """``ValueError`` naming the broken rule when the model does not fit the degrees.

        The shape rules are ParallelDims.check_model's (the messages of ``launch check``), plus what
        only this model knows: K/V heads split or replicated evenly by tp; MoE with tp > 1 needs SP
        (as recipes S1/S2 apply it); the MLP has no TP, CP or EP style.
        """
        if self.architecture == "mlp":
            for name in ("cp", "tp", "ep"):
                if getattr(dims, name) > 1:
                    raise ValueError(
                        f"model {self.name} (an MLP) has no {name} style: it needs {name}=1, "
                        f"got {name}={getattr(dims, name)}"
                    )
            dims.check_model(global_batch=self.global_batch, hidden_sizes=(self.d_model, self.ffn_hidden))
            return
        has_dense_ffn = len(self.moe_layers) < self.n_layers
        hidden = (self.d_model, self.vocab_size) + ((self.ffn_hidden,) if has_dense_ffn else ())
        dims.check_model(
            seq_len=self.seq_len,
            global_batch=self.global_batch,
            sequence_parallel=self.uses_sequence_parallel(dims),
            num_experts=self.num_experts if self.is_moe else None,
            num_heads=self.n_heads,
            hidden_sizes=hidden,
            expert_hidden_sizes=(self.moe_hidden,) if self.is_moe else (),
            ulysses=self.sequence_scheme == SequenceScheme.ULYSSES,
        )
        if self.kv_heads % dims.tp and dims.tp % self.kv_heads:
            raise ValueError(
                f"n_kv_heads={self.kv_heads} and tp={dims.tp}: one must divide the other (TP splits "
                f"K/V heads, or replicates each over tp/n_kv_heads ranks)"
            )
        if self.is_moe and dims.tp > 1 and not self.uses_sequence_parallel(dims):
            raise ValueError(
                "a MoE model with tp > 1 is modelled with sequence parallelism only "
                "(as recipes S1/S2 apply it); leave sequence_parallel on"
            )
        self.accumulation(dims)
        if dims.pp > 1:
            self._check_pipeline(dims)

    def _check_pipeline(self, dims: ParallelDims) -> None:
        """The schedule's rules (torch.distributed.pipelining's): every stage of pp * virtual_stages gets its
        layers (``pipeline.stage_layer_counts``: given, or split with the first and last one short when they
        do not divide); 1F1B needs at least pp microbatches, the interleaved schedules a multiple of their
        rounds, DualPipeV as many as stages. ``ValueError`` gives the nearest valid pp or micro-batch."""
        stages = dims.pp * self.virtual_stages
        if self.architecture != "transformer":
            raise ValueError(f"model {self.name} (an MLP) has no pipeline split in the cost model: it needs pp=1")
        if self.stage_layers is None and stages > self.n_layers:
            valid = [p for p in range(2, self.n_layers // self.virtual_stages + 1) if dims.world_size % p == 0]
            hint = (
                f"nearest valid pp: {min(valid, key=lambda p: (abs(p - dims.pp), p))}"
                if valid
                else "no pp > 1 dividing the world gives every stage a layer; use pp=1"
            )
            raise ValueError(
                f"pp={dims.pp} x virtual_stages={self.virtual_stages} = {stages} stages for n_layers={self.n_layers}: "
                f"each stage needs a layer (or give --stage-layers with empty first/last stages); {hint}"
            )
        stage_layer_counts(self.n_layers, stages, self.stage_layers)
        rows, microbatches = self.accumulation(dims)
        broken = get_schedule(self.pp_schedule).microbatch_rule(dims.pp, microbatches, self.virtual_stages)
        if broken:
            per_rank = rows * microbatches
            valid = [
                b
                for b in range(per_rank, 0, -1)
                if per_rank % b == 0
                and not get_schedule(self.pp_schedule).microbatch_rule(dims.pp, per_rank // b, self.virtual_stages)
            ]
            hint = (
                f"nearest valid --micro-batch: {valid[0]}"
                if valid
                else f"raise the batch (rows per rank: {per_rank}), or use --pp-schedule gpipe"
            )
            raise ValueError(
                f"pp_schedule {self.pp_schedule}: {broken}, got {microbatches} (micro_batch={rows} of the "
                f"{per_rank} rows per rank); {hint}"
            )
