"""The recipe matrix as data: what each recipe is, which degrees it allows, its shapes.

Importing this module does not import torch, so the launcher validates a run in the parent process
in a fraction of a second; the worker imports the recipe's ``implementation`` ("module:function").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import DEGREE_NAMES

DEGREE_KEYS = ("world_size",) + DEGREE_NAMES


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    description: str
    matrix_row: str  # the completeness-matrix row this recipe covers
    tier: str  # CI tier marker: l0, l1, l2 (or "" for tiers A/B/C outside L0-L2)
    default: dict[str, int]  # world_size and degrees of the default run
    alternatives: tuple[dict[str, int], ...]  # other valid meshes the tests also run
    implementation: str  # "module:function" building the workload inside a worker
    shapes: dict = field(default_factory=dict)  # keyword arguments of ParallelDims.check_model
    must_be_one: tuple[str, ...] = ()
    must_exceed_one: tuple[str, ...] = ()
    at_least_one_of: tuple[str, ...] = ()  # at least one of these degrees must be > 1
    steps: int = 3

    def validate(self, **degrees: int) -> ParallelDims:
        """The ParallelDims of a run of this recipe, or ``ValueError`` naming the broken rule."""
        unknown = set(degrees) - set(DEGREE_KEYS)
        if unknown:
            raise ValueError(f"unknown degree(s) {sorted(unknown)}; known: {list(DEGREE_KEYS)}")
        merged = {**{k: v for k, v in self.default.items() if k == "world_size"}, **degrees}
        if "world_size" not in merged:
            raise ValueError("world_size is required")
        dims = ParallelDims(**merged)
        if dims.pp > 1 and "pp" not in self.must_exceed_one:
            pipelined = [r.name for r in RECIPES.values() if "pp" in r.must_exceed_one]
            raise ValueError(
                f"recipe {self.name} ({self.title}) does not pipeline: it needs pp=1, got pp={dims.pp}; "
                f"pipeline recipes: {', '.join(pipelined)}"
            )
        for name in self.must_be_one:
            if getattr(dims, name) != 1:
                raise ValueError(f"recipe {self.name} ({self.title}) needs {name}=1, got {name}={getattr(dims, name)}")
        for name in self.must_exceed_one:
            if getattr(dims, name) <= 1:
                raise ValueError(
                    f"recipe {self.name} ({self.title}) needs {name} > 1, got {name}={getattr(dims, name)}"
                )
        if self.at_least_one_of and all(getattr(dims, n) == 1 for n in self.at_least_one_of):
            raise ValueError(
                f"recipe {self.name} ({self.title}) needs at least one of {list(self.at_least_one_of)} > 1"
            )
        dims.check_model(**self.shapes)
        return dims

    def constraints(self) -> str:
        parts = [f"{n}=1" for n in self.must_be_one] + [f"{n}>1" for n in self.must_exceed_one]
        if self.at_least_one_of:
            parts.append(" or ".join(f"{n}>1" for n in self.at_least_one_of))
        return ", ".join(parts)


_MLP_SHAPES = {"global_batch": 16, "hidden_sizes": (32, 64)}
# TransformerConfig defaults: d_model 32, 4 heads, hidden 64, vocab 64, seq_len 16; global batch 8.
_TRANSFORMER_SHAPES = {"global_batch": 8, "seq_len": 16, "num_heads": 4, "hidden_sizes": (32, 64, 64)}
_SP_SHAPES = {**_TRANSFORMER_SHAPES, "sequence_parallel": True}
_ULYSSES_SHAPES = {**_TRANSFORMER_SHAPES, "ulysses": True}  # n_heads % (tp * cp) == 0
_SP_ULYSSES_SHAPES = {**_SP_SHAPES, "ulysses": True}
# MOE_CONFIG: layer 1 is a MoE with 4 experts of hidden 32, top-2, a shared expert.
_MOE_SHAPES = {**_SP_SHAPES, "num_experts": 4, "expert_hidden_sizes": (32,)}
_DENSE = "hyper_parallel.recipes.transformer"
# PIPELINE_CONFIG: 4 layers (2 stages of 2, or 4 of 1 interleaved), 4 microbatches per data-parallel rank.
_PIPELINE_SHAPES = {**_TRANSFORMER_SHAPES, "n_layers": 4, "microbatches": 4}
_PIPELINE = "hyper_parallel.recipes.pipeline"
_MOE = "hyper_parallel.recipes.moe"

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe(
            name="M1",
            title="DDP through fully_shard(enable_param_shard=False)",
            description="Plain data parallelism: every rank keeps whole parameters and sees a slice of the "
            "global batch; fully_shard with enable_param_shard=False only all-reduces gradients "
            "over the data-parallel group.",
            matrix_row="M1 | dense | TP 1 | SP 0 | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | pure DDP | 2-layer MLP",
            tier="l0",
            default={"world_size": 2, "dp_shard": 2},
            alternatives=({"world_size": 4, "dp_replicate": 2, "dp_shard": 2},),
            implementation="hyper_parallel.recipes.dense:ddp_mlp",
            shapes=_MLP_SHAPES,
            must_be_one=("cp", "tp", "ep"),
            at_least_one_of=("dp_replicate", "dp_shard"),
        ),
        Recipe(
            name="M4",
            title="FSDP only",
            description="Parameters, gradients and optimizer state sharded over dp_shard: all-gather before "
            "forward and backward, reduce-scatter of gradients.",
            matrix_row="M4 | dense | TP 1 | SP 0 | CP 1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | FSDP2 only | MLP",
            tier="l0",
            default={"world_size": 2, "dp_shard": 2},
            alternatives=({"world_size": 4, "dp_shard": 4},),
            implementation="hyper_parallel.recipes.dense:fsdp_mlp",
            shapes=_MLP_SHAPES,
            must_be_one=("dp_replicate", "cp", "tp", "ep"),
            must_exceed_one=("dp_shard",),
        ),
        Recipe(
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
            shapes=_TRANSFORMER_SHAPES,
            must_be_one=("cp", "ep"),
            must_exceed_one=("tp",),
        ),
        Recipe(
            name="M3",
            title="tensor + sequence parallelism",
            description="TP with the residual stream sharded along the sequence between blocks: norms run on "
            "sequence shards, each block's input is all-gathered and its output reduce-scattered. "
            "Norm weights get Partial gradients over tp, which fully_shard sums (notebook 03_pure_tp_fix).",
            matrix_row="M3 | dense | TP >1 | SP 1 | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | TP+SP | mini transformer",
            tier="l1",
            default={"world_size": 2, "tp": 2},
            alternatives=({"world_size": 4, "dp_shard": 2, "tp": 2},),
            implementation="hyper_parallel.recipes.transformer:tensor_sequence_parallel",
            shapes=_SP_SHAPES,
            must_be_one=("cp", "ep"),
            must_exceed_one=("tp",),
        ),
        Recipe(
            name="M5",
            title="context parallelism + FSDP",
            description="The sequence split into 2*cp load-balanced chunks; attention all-gathers K/V over cp. "
            "CP ranks also shard parameters: fsdp = dp_shard * cp.",
            matrix_row="M5 | dense | TP 1 | SP 0 | CP >1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | cp in fsdp, seq_len % 2cp | mini transformer",
            tier="l1",
            default={"world_size": 2, "cp": 2, "dp_shard": 1},
            alternatives=({"world_size": 4, "dp_shard": 2, "cp": 2},),
            implementation="hyper_parallel.recipes.transformer:fsdp_transformer",
            shapes=_TRANSFORMER_SHAPES,
            must_be_one=("tp", "ep", "dp_replicate"),
            must_exceed_one=("cp",),
        ),
        Recipe(
            name="M6",
            title="TP + SP + CP + FSDP",
            description="Four dense dims at once (TorchTitan llama3): TP+SP inside each block, CP attention, "
            "parameters sharded over fsdp = dp_shard * cp with the TP placement kept.",
            matrix_row="M6 | dense | TP >1 | SP 1 | CP >1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | seq_len % (tp*2*cp) | mini transformer",
            tier="l1",
            default={"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2},
            alternatives=({"world_size": 4, "dp_shard": 1, "cp": 2, "tp": 2},),
            implementation="hyper_parallel.recipes.transformer:fsdp_transformer",
            shapes=_SP_SHAPES,
            must_be_one=("ep", "dp_replicate"),
            must_exceed_one=("tp", "cp"),
        ),
        Recipe(
            name="M5-R",
            title="ring context parallelism + FSDP",
            description="M5 with K/V passed around the cp ring instead of all-gathered: cp-1 shifts per attention "
            "(an online softmax folds each block in), the same shifts backwards for the gradients. Same "
            "tokens per rank and the same losses as M5.",
            matrix_row="M5-R | dense | TP 1 | SP 0 | CP >1 (ring) | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | M5's dims, ring K/V | mini transformer",
            tier="",
            default={"world_size": 2, "cp": 2, "dp_shard": 1},
            alternatives=({"world_size": 4, "cp": 4},),
            implementation="hyper_parallel.recipes.transformer:fsdp_transformer_ring",
            shapes=_TRANSFORMER_SHAPES,
            must_be_one=("tp", "ep", "dp_replicate"),
            must_exceed_one=("cp",),
        ),
        Recipe(
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
            shapes=_ULYSSES_SHAPES,
            must_be_one=("tp", "ep", "dp_replicate"),
            must_exceed_one=("cp",),
        ),
        Recipe(
            name="M6-U",
            title="TP + SP + Ulysses + FSDP",
            description="M6 with Ulysses attention on the cp ranks: TP splits the heads by tp, Ulysses splits "
            "each tp rank's heads again by cp (n_heads % (tp*cp) == 0).",
            matrix_row="M6-U | dense | TP >1 | SP 1 | CP >1 (Ulysses) | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | n_heads % (tp*cp), seq_len % (tp*2*cp) | mini transformer",
            tier="",
            default={"world_size": 4, "dp_shard": 1, "cp": 2, "tp": 2},
            alternatives=({"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2},),
            implementation="hyper_parallel.recipes.transformer:fsdp_transformer_ulysses",
            shapes=_SP_ULYSSES_SHAPES,
            must_be_one=("ep", "dp_replicate"),
            must_exceed_one=("tp", "cp"),
        ),
        Recipe(
            name="M7",
            title="HSDP (dp_replicate x fsdp), TP/CP optional",
            description="Parameters sharded within each replica group and replicated across groups: gradients "
            "reduce-scatter over fsdp, then all-reduce over dp_replicate.",
            matrix_row="M7 | dense | TP >1 | SP 0..1 | CP 1..>1 | FSDP2 >0 | dp_rep 1 | EP 0 | ETP 0 | HSDP | mini transformer",
            tier="l1",
            default={"world_size": 4, "dp_replicate": 2, "dp_shard": 2},
            alternatives=({"world_size": 8, "dp_replicate": 2, "dp_shard": 2, "tp": 2},),
            implementation="hyper_parallel.recipes.transformer:fsdp_transformer",
            shapes=_SP_SHAPES,
            must_be_one=("ep",),
            must_exceed_one=("dp_replicate",),
            at_least_one_of=("dp_shard", "cp"),
        ),
        Recipe(
            name="P1",
            title="pipeline (1F1B) x FSDP",
            description="The transformer cut by layers into pp stages on torch.distributed.pipelining; each stage "
            "is fully_shard over its own (dp_replicate, fsdp) ranks. Schedule1F1B: after pp-1 warm-up "
            "forwards each rank alternates one forward, one backward; activations and their gradients "
            "cross stages by send/recv, 4 microbatches per step.",
            matrix_row="P1 | dense | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1, 1F1B, n_layers % pp | mini transformer (4 layers)",
            tier="l1",
            default={"world_size": 4, "pp": 2, "dp_shard": 2},
            alternatives=({"world_size": 2, "pp": 2},),
            implementation=f"{_PIPELINE}:one_f_one_b",
            shapes=_PIPELINE_SHAPES,
            must_be_one=("cp", "tp", "ep"),
            must_exceed_one=("pp",),
        ),
        Recipe(
            name="P1-G",
            title="pipeline (GPipe) x FSDP",
            description="P1 with ScheduleGPipe: every microbatch's forward, then every backward (fill-drain); the "
            "same bubble as 1F1B, but all microbatches' activations alive at once. Same losses as P1.",
            matrix_row="P1-G | dense | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1, GPipe | mini transformer (4 layers)",
            tier="",
            default={"world_size": 4, "pp": 2, "dp_shard": 2},
            alternatives=(),
            implementation=f"{_PIPELINE}:gpipe",
            shapes=_PIPELINE_SHAPES,
            must_be_one=("cp", "tp", "ep"),
            must_exceed_one=("pp",),
        ),
        Recipe(
            name="P1-I",
            title="pipeline (interleaved 1F1B, 2 stages per rank) x FSDP",
            description="P1 with 4 stages of one layer, 2 per rank in a loop (rank r holds stages r and r+pp): "
            "ScheduleInterleaved1F1B shrinks the bubble by the number of stages per rank, for twice "
            "the sends. Same losses as P1.",
            matrix_row="P1-I | dense | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1, interleaved, n_layers % (2 pp) | mini transformer (4 layers)",
            tier="",
            default={"world_size": 4, "pp": 2, "dp_shard": 2},
            alternatives=(),
            implementation=f"{_PIPELINE}:interleaved",
            shapes={**_PIPELINE_SHAPES, "stages_per_rank": 2},
            must_be_one=("cp", "tp", "ep"),
            must_exceed_one=("pp",),
        ),
        Recipe(
            name="P2",
            title="pipeline (1F1B) x FSDP x TP",
            description="P1 with tensor parallelism inside every stage (TP without SP, as B-1): each stage is a "
            "(dp_replicate, fsdp, tp) mesh of its own; the activations sent between stages are "
            "replicated over tp, so each tp rank sends its copy to its peer of the next stage.",
            matrix_row="P2 | dense | TP >1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP 0 | ETP 0 | PP >1 x TP, 1F1B | mini transformer (4 layers)",
            tier="l2",
            default={"world_size": 8, "pp": 2, "dp_shard": 2, "tp": 2},
            alternatives=({"world_size": 4, "pp": 2, "tp": 2},),
            implementation=f"{_PIPELINE}:one_f_one_b",
            shapes=_PIPELINE_SHAPES,
            must_be_one=("cp", "ep"),
            must_exceed_one=("pp", "tp"),
        ),
        Recipe(
            name="P3",
            title="pipeline (1F1B) x EP (MoE) x FSDP",
            description="P1 on a 4-layer MoE transformer (layers 1 and 3 MoE: one per stage); inside each stage "
            "the experts are spread over ep (all-to-all dispatch per microbatch) and are a fully_shard "
            "unit on the stage's sparse view, as in S1.",
            matrix_row="P3 | sparse | TP 1 | SP 0 | CP 1 | FSDP2 >=1 | dp_rep 0..1 | EP >1 | ETP 1 | PP >1 x EP, 1F1B | mini MoE (4 layers)",
            tier="",
            default={"world_size": 4, "pp": 2, "dp_shard": 2, "ep": 2},
            alternatives=(),
            implementation=f"{_PIPELINE}:expert_parallel",
            shapes={**_PIPELINE_SHAPES, "num_experts": 4, "expert_hidden_sizes": (32,)},
            must_be_one=("cp", "tp", "etp"),
            must_exceed_one=("pp", "ep"),
        ),
        Recipe(
            name="S1",
            title="MoE: EP (etp=1) + dual-stack FSDP",
            description="Experts Shard(0) over ep, tokens dispatched and combined by all-to-all; experts are a "
            "fully_shard unit on the sparse view (dp_replicate, efsdp), dense layers on (dp_replicate, "
            "fsdp). EP borrows ranks from dp_shard (and cp, tp): it is not a factor of world_size.",
            matrix_row="S1 | sparse | TP >=1 | SP * | CP 1..>1 | FSDP2 >0 | dp_rep 0..1 | EP >1 | ETP 1 | EP only, etp=1, dual-stack FSDP | mini MoE",
            tier="l2",
            default={"world_size": 4, "dp_shard": 4, "ep": 2},
            alternatives=({"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2},),
            implementation=f"{_MOE}:expert_parallel",
            shapes=_MOE_SHAPES,
            must_exceed_one=("ep",),
            must_be_one=("etp",),
        ),
        Recipe(
            name="S2",
            title="MoE: EP + ETP (etp = tp) + dual-stack FSDP",
            description="As S1, and each expert's hidden dim split over etp = tp (w1 colwise, w2 rowwise, partial "
            "outputs all-reduced over etp); the MoE sees the whole sequence of its tp group.",
            matrix_row="S2 | sparse | TP >1 | SP * | CP 1..>1 | FSDP2 >0 | dp_rep 0..1 | EP >1 | ETP tp | ETP=TP, dispatch on ep | mini MoE + ETP",
            tier="l2",
            default={"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2, "etp": 2},
            alternatives=({"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2, "ep": 2, "etp": 2},),
            implementation=f"{_MOE}:expert_parallel",
            shapes=_MOE_SHAPES,
            must_exceed_one=("ep", "etp"),
        ),
        Recipe(
            name="S3",
            title="MoE: S1's dims through all-gather dispatch",
            description="The same model and dims as S1 with a second implementation of the dispatch: tokens "
            "all-gathered over ep, local experts applied, outputs reduce-scattered back; its numbers "
            "must equal S1's.",
            matrix_row="S3 | sparse | TP any | SP * | CP 1..>1 | FSDP2 >0 | dp_rep 0..1 | EP >1 | ETP 1 | same dims as S1, other path | compare with S1",
            tier="",
            default={"world_size": 4, "dp_shard": 4, "ep": 2},
            alternatives=(),
            implementation=f"{_MOE}:expert_parallel_all_gather",
            shapes=_MOE_SHAPES,
            must_exceed_one=("ep",),
            must_be_one=("etp",),
        ),
    ]
}


def _tier(
    name: str,
    title: str,
    row: str,
    default: dict,
    implementation: str,
    shapes: dict,
    tier: str = "",
    alternatives: tuple = (),
) -> Recipe:
    """A tier A/B/C entry: a named mesh of an existing workload."""
    return Recipe(
        name=name,
        title=title,
        description=f"Tier {name}: {title}.",
        matrix_row=row,
        tier=tier,
        default=default,
        alternatives=alternatives,
        implementation=implementation,
        shapes=shapes,
    )


TIERS = [
    _tier(
        "A-TP",
        "TP only",
        "A-TP | tp=2/4 | Col/Row/all-gather vs reference",
        {"world_size": 2, "tp": 2},
        f"{_DENSE}:tensor_parallel",
        _TRANSFORMER_SHAPES,
        alternatives=({"world_size": 4, "tp": 4},),
    ),
    _tier(
        "A-CP",
        "CP only (CP ranks shard parameters)",
        "A-CP | cp=2/4 | CP attention vs full sequence",
        {"world_size": 2, "cp": 2},
        f"{_DENSE}:fsdp_transformer",
        _TRANSFORMER_SHAPES,
        alternatives=({"world_size": 4, "cp": 4},),
    ),
    _tier(
        "A-FSDP2",
        "FSDP only on the transformer",
        "A-FSDP2 | dp_shard=2 | parameter sharding, gradients",
        {"world_size": 2, "dp_shard": 2},
        f"{_DENSE}:fsdp_transformer",
        _TRANSFORMER_SHAPES,
    ),
    _tier(
        "A-EP",
        "EP only",
        "A-EP | ep=2 (MoE) | dispatch, expert forward and backward",
        {"world_size": 2, "dp_shard": 2, "ep": 2},
        f"{_MOE}:expert_parallel",
        _MOE_SHAPES,
    ),
    _tier(
        "B-1",
        "TP + FSDP2",
        "B-1 | TP + FSDP2 | fsdp_tp_example, Titan Llama3",
        {"world_size": 4, "dp_shard": 2, "tp": 2},
        f"{_DENSE}:fsdp_transformer_without_sp",
        _TRANSFORMER_SHAPES,
    ),
    _tier(
        "B-2",
        "TP + SP + FSDP2",
        "B-2 | TP + SP + FSDP2 | + enable_sequence_parallel",
        {"world_size": 4, "dp_shard": 2, "tp": 2},
        f"{_DENSE}:fsdp_transformer",
        _SP_SHAPES,
    ),
    _tier(
        "B-3",
        "CP + FSDP2",
        "B-3 | CP + FSDP2 | fsdp already contains cp",
        {"world_size": 4, "dp_shard": 2, "cp": 2},
        f"{_DENSE}:fsdp_transformer",
        _TRANSFORMER_SHAPES,
    ),
    _tier(
        "B-4",
        "TP + CP + FSDP2",
        "B-4 | TP + CP + FSDP2 | seq_len % (tp*2*cp)",
        {"world_size": 4, "cp": 2, "tp": 2},
        f"{_DENSE}:fsdp_transformer",
        _SP_SHAPES,
    ),
    _tier(
        "B-5",
        "HSDP: dp_replicate + fsdp",
        "B-5 | HSDP | get_mesh(['dp_replicate','fsdp'])",
        {"world_size": 4, "dp_replicate": 2, "dp_shard": 2},
        f"{_DENSE}:fsdp_transformer",
        _TRANSFORMER_SHAPES,
        tier="l1",
    ),
    _tier(
        "B-6",
        "EP + FSDP2 (no TP)",
        "B-6 | EP + FSDP2 | dual-stack FSDP",
        {"world_size": 4, "dp_shard": 4, "ep": 2},
        f"{_MOE}:expert_parallel",
        _MOE_SHAPES,
    ),
    _tier(
        "B-7",
        "EP + TP + ETP + FSDP2",
        "B-7 | EP + TP + (ETP) + FSDP2 | ETP=TP and ETP=1",
        {"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2, "etp": 2},
        f"{_MOE}:expert_parallel",
        _MOE_SHAPES,
        tier="l1",
        alternatives=({"world_size": 4, "dp_shard": 2, "tp": 2, "ep": 2, "etp": 1},),
    ),
    _tier(
        "C",
        "8-rank Titan-like grid (dp_replicate, dp_shard, cp, tp) = (1, 2, 2, 2)",
        "C | 8 ranks | (1,2,2,2) dense, MoE variant with ep=2, etp=2",
        {"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2},
        f"{_DENSE}:fsdp_transformer",
        _SP_SHAPES,
        tier="l2",
    ),
    _tier(
        "C-MoE",
        "8-rank grid (1, 2, 2, 2) with MoE, ep=2, etp=2",
        "C | 8 ranks | MoE variant, legal ep/etp pair",
        {"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2, "ep": 2, "etp": 2},
        f"{_MOE}:expert_parallel",
        _MOE_SHAPES,
        tier="l2",
    ),
]
RECIPES.update({recipe.name: recipe for recipe in TIERS})


def get(name: str) -> Recipe:
    by_key = {key.upper(): recipe for key, recipe in RECIPES.items()}
    if name.upper() not in by_key:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}")
    return by_key[name.upper()]
