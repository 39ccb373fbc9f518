"""The models the cost model describes: shapes, parallel style and precision, as plain data (no torch).

Three presets are the recipes' own tiny models, so the cost model can be checked byte for byte
against traced runs; two are at scale, for planning:

    small          the recipes' mini transformer (TransformerConfig() of hyper_parallel.models.transformer:
                   vocab 64, d_model 32, 4 heads, 2 layers, feed-forward 64, seq_len 16; global batch 8)
    small-moe      the MoE recipes' model (recipes/moe.py MOE_CONFIG): layer 1's feed-forward is a MoE
                   with 4 experts of hidden 32, top-2, and a shared expert of hidden 32
    small-mlp      the MLP of M1/M4 (MLPConfig: d_in 16, d_model 32, hidden 64, d_out 8, 2 blocks,
                   seq_len 8, biases; global batch 16)
    llama-8b-like  32 layers, d_model 4096, 32 heads with 8 K/V heads (GQA), SwiGLU feed-forward 14336,
                   vocab 128256, seq_len 8192, global batch 512 sequences (4M tokens): about 8.0e9 parameters
    moe-16e        24 layers, d_model 2048, 16 heads with 4 K/V heads, every feed-forward a MoE of 16
                   SwiGLU experts of hidden 1408, top-2, plus a shared SwiGLU expert of hidden 2816;
                   vocab 32000, seq_len 4096, global batch 1024 sequences (4M tokens): about 4.1e9
                   parameters, about 1.2e9 active per token

Precision (``PRECISIONS``): the recipes train in float32 with SGD (no optimizer state); the presets at
scale assume the usual mixed precision: float32 master parameters and gradients in the sharded storage,
bfloat16 all-gathers and activations (``MixedPrecisionPolicy.param_dtype``), float32 gradient
reduction (``reduce_dtype``), Adam with two float32 states per parameter.

Training knobs (fields of ``ModelConfig``, so ``estimate`` and every planner view honour them):

    micro_batch / grad_accum   rows per rank per forward, and forwards per step: global_batch =
                               dp * micro_batch * grad_accum (give one, the other is derived per layout;
                               neither: one micro-batch of global_batch / dp rows)
    activation_checkpointing   "none", "selective" (recompute the attention core and the feed-forward's
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

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes import registry

INT64_BYTES = 8
"""EP exchanges its per-expert token counts as int64."""
AC_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a rank stores and sends."""

    name: str
    storage: int  # sharded parameters and their gradients (the optimizer's master copy)
    compute: int  # all-gathered parameters and activations (param_dtype)
    reduce: int  # gradient reduce-scatter / all-reduce (reduce_dtype)
    optimizer_state: int  # optimizer state per parameter element (SGD 0, Adam m and v in float32: 8)


PRECISIONS = {
    p.name: p
    for p in [
        Precision("fp32-sgd", storage=4, compute=4, reduce=4, optimizer_state=0),
        Precision("fp32-adam", storage=4, compute=4, reduce=4, optimizer_state=8),
        Precision("bf16-adam", storage=4, compute=2, reduce=4, optimizer_state=8),
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
    sequence_scheme: str = "all_gather"  # cp attention: K/V "all_gather", K/V "ring", or "ulysses"
    precision: Precision = PRECISIONS["fp32-sgd"]
    description: str = ""  # the architecture; ``describe()`` adds the step's shape
    micro_batch: int | None = None
    grad_accum: int | None = None
    activation_checkpointing: str = "none"  # none, selective, full
    loss_parallel: bool = False
    reshard_after_forward: bool = True
    expert_shard_dim: int = 0

    def __post_init__(self) -> None:
        if self.architecture not in ("transformer", "mlp"):
            raise ValueError(f"architecture must be 'transformer' or 'mlp', got {self.architecture!r}")
        if self.dispatch not in ("all_to_all", "all_gather"):
            raise ValueError(f"dispatch must be 'all_to_all' or 'all_gather', got {self.dispatch!r}")
        if self.sequence_scheme not in ("all_gather", "ring", "ulysses"):
            raise ValueError(f"sequence_scheme must be 'all_gather', 'ring' or 'ulysses', got {self.sequence_scheme!r}")
        if self.activation_checkpointing not in AC_MODES:
            raise ValueError(
                f"activation_checkpointing must be one of {', '.join(AC_MODES)}, got {self.activation_checkpointing!r}"
            )
        if self.expert_shard_dim not in (0, 1, 2):
            raise ValueError(
                f"expert_shard_dim must be 0 (experts), 1 or 2 (inside each expert [E, d, h]), "
                f"got {self.expert_shard_dim}"
            )
        for name in ("micro_batch", "grad_accum"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.architecture == "transformer" and (self.d_model % self.n_heads or self.n_heads % self.kv_heads):
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}, and n_heads by "
                f"n_kv_heads={self.kv_heads}"
            )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layers)

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
            ulysses=self.sequence_scheme == "ulysses",
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


_SMALL = ModelConfig("small", description="the recipes' mini transformer (TransformerConfig defaults)")
PRESETS: dict[str, ModelConfig] = {
    m.name: m
    for m in [
        _SMALL,
        _SMALL.replace(
            name="small-moe",
            moe_layers=(1,),
            num_experts=4,
            top_k=2,
            moe_hidden=32,
            shared_expert_hidden=32,
            description="the MoE recipes' model: layer 1 a MoE of 4 experts (hidden 32), top-2, shared expert",
        ),
        ModelConfig(
            "small-mlp",
            architecture="mlp",
            d_model=32,
            ffn_hidden=64,
            n_layers=2,
            seq_len=8,
            global_batch=16,
            d_in=16,
            d_out=8,
            description="the M1/M4 residual MLP (MLPConfig defaults)",
        ),
        ModelConfig(
            "llama-8b-like",
            vocab_size=128256,
            d_model=4096,
            n_heads=32,
            n_kv_heads=8,
            n_layers=32,
            ffn_hidden=14336,
            gated_ffn=True,
            seq_len=8192,
            global_batch=512,
            precision=PRECISIONS["bf16-adam"],
            description="Llama-3-8B shapes: 32 layers, d 4096, 32 heads / 8 K/V heads, SwiGLU 14336, vocab 128256",
        ),
        ModelConfig(
            "moe-16e",
            vocab_size=32000,
            d_model=2048,
            n_heads=16,
            n_kv_heads=4,
            n_layers=24,
            ffn_hidden=0,
            gated_ffn=True,
            seq_len=4096,
            global_batch=1024,
            moe_layers=tuple(range(24)),
            num_experts=16,
            top_k=2,
            moe_hidden=1408,
            shared_expert_hidden=2816,
            precision=PRECISIONS["bf16-adam"],
            description="24 MoE layers, d 2048, 16 heads / 4 K/V heads, 16 SwiGLU experts of 1408, top-2, "
            "shared expert 2816, vocab 32000",
        ),
    ]
}
CLI_MODELS = ("small", "llama-8b-like", "moe-16e", "small-moe", "small-mlp")

_RECIPE_WORKLOADS = {  # a recipe's implementation -> (preset, changes): what its worker builds
    "hyper_parallel.recipes.dense:ddp_mlp": ("small-mlp", {"param_shard": False}),
    "hyper_parallel.recipes.dense:fsdp_mlp": ("small-mlp", {}),
    "hyper_parallel.recipes.transformer:tensor_parallel": ("small", {"sequence_parallel": False, "param_shard": False}),
    "hyper_parallel.recipes.transformer:tensor_sequence_parallel": (
        "small",
        {"sequence_parallel": True, "param_shard": False},
    ),
    "hyper_parallel.recipes.transformer:fsdp_transformer_without_sp": ("small", {"sequence_parallel": False}),
    "hyper_parallel.recipes.transformer:fsdp_transformer": ("small", {}),
    "hyper_parallel.recipes.transformer:fsdp_transformer_ring": ("small", {"sequence_scheme": "ring"}),
    "hyper_parallel.recipes.transformer:fsdp_transformer_ulysses": ("small", {"sequence_scheme": "ulysses"}),
    "hyper_parallel.recipes.moe:expert_parallel": ("small-moe", {}),
    "hyper_parallel.recipes.moe:expert_parallel_all_gather": ("small-moe", {"dispatch": "all_gather"}),
}


def get_model(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(PRESETS)}")
    return PRESETS[name]


def recipe_model(recipe: str) -> ModelConfig:
    """The model (and parallel style) a recipe's worker trains, e.g. ``recipe_model("M6")``."""
    implementation = registry.get(recipe).implementation
    if implementation not in _RECIPE_WORKLOADS:
        raise ValueError(f"the cost model does not describe {implementation!r} (recipe {recipe})")
    preset, changes = _RECIPE_WORKLOADS[implementation]
    return PRESETS[preset].replace(name=f"{preset} ({registry.get(recipe).name})", **changes)
