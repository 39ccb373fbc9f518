"""The fully_shard units of a model and the per-rank sizes of their parameters, without building them.

Units, as the recipes apply ``fully_shard`` bottom-up: every block (``layers.i`` / ``blocks.i``), the
experts of every MoE layer (``layers.i.feed_forward.experts``, on the sparse mesh; with ep == 1 there is
no sparse mesh and they stay in their block, replicated over tp), and the root (embeddings, final
norm, head). The root keeps its parameters from forward to backward; the others
reshard after forward.

Per parameter (docs/design.md §3, ``hyper_parallel.fsdp.param``):

    local shape   the global shape with every axis a model-parallel degree splits divided by it
                  (TP: colwise weights axis 0, rowwise axis 1, embedding axis 0, head axis 0;
                   EP: experts axis 0; ETP: w1/w3 axis 2, w2 axis 1). With tp > K/V heads each rank
                   holds one K/V head, replicated over tp / kv_heads ranks (the sum of those replicas'
                   gradients is not modelled; the recipes' models have no GQA)
    fsdp axis     the first axis no model-parallel degree splits (axis 0 if every axis is split); experts
                  on ``ModelConfig.expert_shard_dim`` when that axis is unsplit (a what-if: padding 16
                  experts to 512 shards on axis 0 stores 32x the experts, the hidden axis pads nothing)
    padded numel  local numel with the fsdp axis rounded up to a multiple of shard_size S:
                  prod(local) / local[a] * ceil(local[a] / S) * S

A unit's flat shard on every rank holds sum(padded numel) / S elements; its all-gather buffer and its
reduce-scatter input hold sum(padded numel).

Meshes and groups (``hyper_parallel.fsdp.roles``): dense units use (dp_replicate, fsdp), experts
(dp_replicate, efsdp). The inner dim shards when its size is > 1 (and ``param_shard`` is not False),
otherwise it joins the replicate dims: the unsharded (all-reduce) group is then "dp_replicate+fsdp".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

from hyper_parallel.cost_model.model_configs import ModelConfig
from hyper_parallel.mesh import ParallelDims


@dataclass(frozen=True)
class Param:
    name: str
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]  # after TP / EP / ETP
    split_axes: tuple[int, ...] = ()  # axes a model-parallel degree > 1 splits
    partial_over_tp: bool = False  # its gradient is summed over tp by fully_shard (SP norms, ...)
    preferred_axis: int = 0  # FSDP shards this axis when no model-parallel degree splits it

    def fsdp_axis(self) -> int:
        if self.preferred_axis and self.preferred_axis not in self.split_axes:
            return self.preferred_axis
        return next((axis for axis in range(len(self.local_shape)) if axis not in self.split_axes), 0)

    def padded_numel(self, shard_size: int) -> int:
        """Elements of this parameter in the unit's all-gather buffer (padded to a multiple of shard_size)."""
        axis = self.fsdp_axis()
        rest = math.prod(self.local_shape) // self.local_shape[axis]
        return rest * math.ceil(self.local_shape[axis] / shard_size) * shard_size

    @property
    def local_numel(self) -> int:
        return math.prod(self.local_shape)

    @property
    def global_numel(self) -> int:
        return math.prod(self.global_shape)


@dataclass(frozen=True)
class Unit:
    name: str
    params: tuple[Param, ...]
    shard_size: int
    dp_size: int
    sharded_group: str  # reduce-scatter group ("" when shard_size == 1)
    unsharded_group: str  # all-reduce group
    is_root: bool = False
    reshard: bool = True  # ModelConfig.reshard_after_forward (the root never reshards)

    @property
    def reshard_after_forward(self) -> bool:
        return self.reshard and not self.is_root

    @cached_property
    def _sizes(self) -> tuple[int, int, int, int]:
        return _unit_sizes(self.params, self.shard_size)

    @property
    def gathered_numel(self) -> int:
        """The all-gather buffer (and reduce-scatter input): sum of padded numels."""
        return self._sizes[0]

    @property
    def shard_numel(self) -> int:
        """What every rank stores: the unit's flat shard."""
        return self.gathered_numel // self.shard_size

    @property
    def local_numel(self) -> int:
        return self._sizes[1]

    @property
    def global_numel(self) -> int:
        return self._sizes[2]

    def partial_numel(self) -> int:
        """Elements all-reduced over tp after the reduce-scatter (this rank's shards of partial params)."""
        return self._sizes[3]

    def renamed(self, name: str) -> Unit:
        """The same unit under another name, its sizes carried over (every layer of a kind is alike)."""
        unit = Unit(
            name,
            self.params,
            self.shard_size,
            self.dp_size,
            self.sharded_group,
            self.unsharded_group,
            self.is_root,
            self.reshard,
        )
        unit.__dict__["_sizes"] = self._sizes
        return unit


@lru_cache(maxsize=65536)
def _unit_sizes(params: tuple[Param, ...], shard_size: int) -> tuple[int, int, int, int]:
    """(gathered, local, global, partial-over-tp shard) elements of a unit's parameters: every block of a
    model is the same parameters under another name, so a --compare over thousands of layouts computes
    each once per layout instead of once per layer."""
    return (
        sum(p.padded_numel(shard_size) for p in params),
        sum(p.local_numel for p in params),
        sum(p.global_numel for p in params),
        sum(p.padded_numel(shard_size) // shard_size for p in params if p.partial_over_tp),
    )


def _split(shape: tuple[int, ...], splits: dict[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    local = tuple(size // splits.get(axis, 1) for axis, size in enumerate(shape))
    return local, tuple(axis for axis, degree in splits.items() if degree > 1)


def _param(name: str, shape: tuple[int, ...], splits: dict[int, int] | None = None, partial: bool = False) -> Param:
    local, axes = _split(shape, splits or {})
    return Param(name, shape, local, axes, partial)


def _ffn(prefix: str, d: int, hidden: int, gated: bool, tp: int, partial: bool, bias: bool = False) -> list[Param]:
    """w1 (and w3) colwise, w2 rowwise over ``tp`` (1: replicated plain weights); with ``bias`` the colwise
    biases split like their rows, w2's bias is replicated (its gradient summed over the sequence shards)."""
    names = ("w1", "w3") if gated else ("w1",)
    params = [_param(f"{prefix}.{n}.weight", (hidden, d), {0: tp}, partial) for n in names]
    params += [_param(f"{prefix}.{n}.bias", (hidden,), {0: tp}, partial) for n in names if bias]
    params.append(_param(f"{prefix}.w2.weight", (d, hidden), {1: tp}, partial))
    return params + ([_param(f"{prefix}.w2.bias", (d,), partial=partial or tp > 1)] if bias else [])


def _attention(config: ModelConfig, tp: int) -> list[Param]:
    """wq, wk, wv colwise and wo rowwise over tp (K/V heads replicated when tp > kv_heads); with
    ``qk_norm`` one RMSNorm weight per query and key head dimension; MLA instead (``_latent_attention``)."""
    if config.kv_lora_rank:
        return _latent_attention(config, tp)
    d, kv = config.d_model, config.kv_heads * config.head_dim
    kv_local = config.kv_heads_per_rank(tp) * config.head_dim
    kv_params = [Param(f"attention.{n}.weight", (kv, d), (kv_local, d), (0,) if tp > 1 else ()) for n in ("wk", "wv")]
    params = [_param("attention.wq.weight", (config.q_dim, d), {0: tp})] + kv_params
    if config.attention_bias or config.linear_bias:
        params.append(_param("attention.wq.bias", (config.q_dim,), {0: tp}))
        params += [Param(f"attention.{n}.bias", (kv,), (kv_local,), (0,) if tp > 1 else ()) for n in ("wk", "wv")]
    if config.qk_norm:
        params += [_param(f"attention.{n}.weight", (config.head_dim,), partial=tp > 1) for n in ("q_norm", "k_norm")]
    params.append(_param("attention.wo.weight", (d, config.attention_out_dim), {1: tp}))
    return params + ([_param("attention.wo.bias", (d,), partial=tp > 1)] if config.linear_bias else [])


def _latent_attention(config: ModelConfig, tp: int) -> list[Param]:
    """Multi-head latent attention (DeepSeek-V2 section 2.1, V3 section 2.1.1): queries through a rank
    q_lora_rank bottleneck (or wq directly), keys and values from one compressed vector of kv_lora_rank
    plus a shared rotary key; the down-projections and their norms replicated over tp (gradients summed),
    the up-projections colwise by heads, wo rowwise."""
    d, heads, partial = config.d_model, config.n_heads, tp > 1
    q_out = heads * config.head_dim
    if config.q_lora_rank:
        q = [
            _param("attention.wq_a.weight", (config.q_lora_rank, d), partial=partial),
            _param("attention.q_norm.weight", (config.q_lora_rank,), partial=partial),
            _param("attention.wq_b.weight", (q_out, config.q_lora_rank), {0: tp}),
        ]
    else:
        q = [_param("attention.wq.weight", (q_out, d), {0: tp})]
    kv_out = heads * (config.qk_nope_head_dim + config.v_head_dim)
    return q + [
        _param("attention.wkv_a.weight", (config.kv_lora_rank + config.qk_rope_head_dim, d), partial=partial),
        _param("attention.kv_norm.weight", (config.kv_lora_rank,), partial=partial),
        _param("attention.wkv_b.weight", (kv_out, config.kv_lora_rank), {0: tp}),
        _param("attention.wo.weight", (d, config.attention_out_dim), {1: tp}),
    ]


def _norm(name: str, config: ModelConfig, partial: bool) -> list[Param]:
    """RMSNorm's weight, or LayerNorm's weight and bias (``linear_bias``, GPT-2)."""
    d = config.d_model
    return [_param(f"{name}.weight", (d,), partial=partial)] + (
        [_param(f"{name}.bias", (d,), partial=partial)] if config.linear_bias else []
    )


def _transformer_block(config: ModelConfig, dims: ParallelDims, moe: bool) -> list[Param]:
    tp = dims.tp
    sp = config.uses_sequence_parallel(dims)
    d = config.d_model
    params = [*_norm("attention_norm", config, sp), *_attention(config, tp), *_norm("ffn_norm", config, sp)]
    if not moe:
        ffn = _ffn("feed_forward", d, config.ffn_hidden, config.gated_ffn, tp, False, config.linear_bias)
        return params + ffn
    # router and shared expert (and experts without EP): replicated over tp; with etp == 1 they see
    # only the sequence shard, so their gradients are partial over tp
    partial = tp > 1 and dims.etp == 1
    params.append(_param("feed_forward.router.gate.weight", (config.num_experts, d), partial=partial))
    if config.shared_expert_hidden:
        params += _ffn("feed_forward.shared", d, config.shared_expert_hidden, config.gated_ffn, 1, partial)
    if config.shared_expert_gate:
        params.append(_param("feed_forward.shared_gate.weight", (1, d), partial=partial))
    if dims.ep == 1:
        params += [
            dataclasses.replace(p, name=f"feed_forward.experts.{p.name}", partial_over_tp=partial)
            for p in _experts(config, dims)
        ]
    return params


def _experts(config: ModelConfig, dims: ParallelDims) -> list[Param]:
    e, d, h, ep, etp = config.num_experts, config.d_model, config.moe_hidden, dims.ep, dims.etp
    names = ("w1", "w3") if config.gated_ffn else ("w1",)
    axis = config.expert_shard_dim  # on w2 [E, h, d] the same dimension (d or h) sits on the other axis
    params = [dataclasses.replace(_param(n, (e, d, h), {0: ep, 2: etp}), preferred_axis=axis) for n in names]
    w2_axis = {0: 0, 1: 2, 2: 1}[axis]
    return params + [dataclasses.replace(_param("w2", (e, h, d), {0: ep, 1: etp}), preferred_axis=w2_axis)]


def _mlp_params(config: ModelConfig) -> tuple[list[list[Param]], list[Param]]:
    d, h = config.d_model, config.ffn_hidden
    block = [
        _param("norm.weight", (d,)),
        _param("w1.weight", (h, d)),
        _param("w1.bias", (h,)),
        _param("w2.weight", (d, h)),
        _param("w2.bias", (d,)),
    ]
    root = [
        _param("inp.weight", (d, config.d_in)),
        _param("inp.bias", (d,)),
        _param("head.weight", (config.d_out, d)),
        _param("head.bias", (config.d_out,)),
    ]
    return [block] * config.n_layers, root


def _unit(
    name: str,
    params: list[Param],
    data_sizes: tuple[tuple[str, int], tuple[str, int]],
    shard: bool | None,
    is_root: bool = False,
    reshard: bool = True,
) -> Unit:
    """fully_shard's roles on a (replicate, inner) mesh: the inner dim shards iff asked / of size > 1."""
    (replicate, replicas), (inner, inner_size) = data_sizes
    if shard is True or (shard is None and inner_size > 1):
        return Unit(name, tuple(params), inner_size, replicas, inner, replicate, is_root, reshard)
    return Unit(name, tuple(params), 1, replicas * inner_size, "", f"{replicate}+{inner}", is_root, reshard)


def build_units(config: ModelConfig, dims: ParallelDims) -> list[Unit]:
    """Every fully_shard unit of ``config`` on ``dims`` (blocks in order, experts after their block, root
    last); parameter names are relative to their unit, as fully_shard names them."""
    dense = (("dp_replicate", dims.dp_replicate), ("fsdp", dims.fsdp))
    if config.architecture == "mlp":
        blocks, root = _mlp_params(config)
        units = [
            _unit(f"blocks.{i}", params, dense, config.param_shard, reshard=config.reshard_after_forward)
            for i, params in enumerate(blocks)
        ]
        return units + [_unit("root", root, dense, config.param_shard, is_root=True)]
    sparse = (("dp_replicate", dims.dp_replicate), ("efsdp", dims.efsdp))
    blocks = {
        moe: _transformer_block(config, dims, moe)
        for moe in {config.is_moe_layer(layer) for layer in range(config.n_layers + config.mtp_layers)}
    }
    experts = _experts(config, dims)
    reshard = config.reshard_after_forward
    kinds = {
        moe: _unit("layers.0", params, dense, config.param_shard, reshard=reshard) for moe, params in blocks.items()
    }
    expert_unit = _unit("layers.0.feed_forward.experts", experts, sparse, config.param_shard, reshard=reshard)
    units = []
    for layer in range(config.n_layers):  # every layer of a kind is its kind's unit renamed
        moe = config.is_moe_layer(layer)
        units.append(kinds[moe].renamed(f"layers.{layer}"))
        if moe and dims.ep > 1:
            units.append(expert_unit.renamed(f"layers.{layer}.feed_forward.experts"))
    for k in range(config.mtp_layers):  # after the last layer, on the head's stage (stages.py)
        layer = config.n_layers + k
        moe = config.is_moe_layer(layer)
        extra = [*_norm("enorm", config, False), *_norm("hnorm", config, False)]
        extra.append(_param("eh_proj.weight", (config.d_model, 2 * config.d_model)))
        units.append(
            _unit(f"mtp.{k}", extra + blocks[moe], dense, config.param_shard, reshard=config.reshard_after_forward)
        )
        if moe and dims.ep > 1:
            units.append(
                _unit(
                    f"mtp.{k}.feed_forward.experts",
                    experts,
                    sparse,
                    config.param_shard,
                    reshard=config.reshard_after_forward,
                )
            )
    sp = config.uses_sequence_parallel(dims)
    d, vocab, tp = config.d_model, config.vocab_size, dims.tp
    root = [_param("tok_embeddings.weight", (vocab, d), {0: tp})]
    if config.position_embeddings:
        root.append(_param("pos_embeddings.weight", (config.position_embeddings, d), partial=sp))
    if config.embedding_norm:  # BLOOM's word_embeddings_layernorm
        root += _norm("tok_embeddings_norm", config, sp)
    root += _norm("norm", config, sp)
    root += [] if config.tied_embeddings else [_param("output.weight", (vocab, d), {0: tp})]
    return units + [_unit("root", root, dense, config.param_shard, is_root=True)]


def parameter_count(config: ModelConfig) -> int:
    """Parameters of the whole model (global shapes, every unit once): what a model card calls its size."""
    return sum(u.global_numel for u in build_units(config, ParallelDims(world_size=1)))
