"""The recipe matrix (seed 002 §5) as data: what each recipe is, which degrees it allows, its shapes.

Importing this module does not import torch, so the launcher validates a run in the parent process
in a fraction of a second; the worker imports the recipe's ``implementation`` ("module:function").
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hyper_parallel.mesh import DEGREE_NAMES, ParallelDims

DEGREE_KEYS = ("world_size",) + DEGREE_NAMES


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    description: str
    matrix_row: str                      # the seed's matrix row this recipe covers
    tier: str                            # CI tier marker: l0, l1, l2 (or "" for tiers A/B/C outside L0-L2)
    default: dict[str, int]              # world_size and degrees of the default run
    alternatives: tuple[dict[str, int], ...]  # other valid meshes the tests also run
    implementation: str                  # "module:function" building the workload inside a worker
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
        for name in self.must_be_one:
            if getattr(dims, name) != 1:
                raise ValueError(f"recipe {self.name} ({self.title}) needs {name}=1, got {name}={getattr(dims, name)}")
        for name in self.must_exceed_one:
            if getattr(dims, name) <= 1:
                raise ValueError(f"recipe {self.name} ({self.title}) needs {name} > 1, got {name}={getattr(dims, name)}")
        if self.at_least_one_of and all(getattr(dims, n) == 1 for n in self.at_least_one_of):
            raise ValueError(f"recipe {self.name} ({self.title}) needs at least one of "
                             f"{list(self.at_least_one_of)} > 1")
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

RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe(
        name="M1", title="DDP through fully_shard(enable_param_shard=False)",
        description="Plain data parallelism: every rank keeps whole parameters and sees a slice of the "
                    "global batch; fully_shard with enable_param_shard=False only all-reduces gradients "
                    "over the data-parallel group (RFC 2.2.2 case 2).",
        matrix_row="M1 | dense | TP 1 | SP 0 | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | pure DDP | 2-layer MLP",
        tier="l0", default={"world_size": 2, "dp_shard": 2}, alternatives=({"world_size": 4, "dp_replicate": 2, "dp_shard": 2},),
        implementation="hyper_parallel.recipes.dense:ddp_mlp", shapes=_MLP_SHAPES,
        must_be_one=("cp", "tp", "ep"), at_least_one_of=("dp_replicate", "dp_shard")),
    Recipe(
        name="M4", title="FSDP only",
        description="Parameters, gradients and optimizer state sharded over dp_shard: all-gather before "
                    "forward and backward, reduce-scatter of gradients (RFC test 1).",
        matrix_row="M4 | dense | TP 1 | SP 0 | CP 1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | FSDP2 only | MLP",
        tier="l0", default={"world_size": 2, "dp_shard": 2}, alternatives=({"world_size": 4, "dp_shard": 4},),
        implementation="hyper_parallel.recipes.dense:fsdp_mlp", shapes=_MLP_SHAPES,
        must_be_one=("dp_replicate", "cp", "tp", "ep"), must_exceed_one=("dp_shard",)),
    Recipe(
        name="M2", title="pure tensor parallelism",
        description="Attention and feed-forward split over tp (wq/wk/wv/w1 colwise, wo/w2 rowwise) on "
                    "torch's DTensor parallel styles: each rowwise layer all-reduces its output. Data-parallel "
                    "replicas, if any, only all-reduce gradients (fully_shard enable_param_shard=False).",
        matrix_row="M2 | dense | TP >1 | SP 0 | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | pure TP | mini transformer",
        tier="l0", default={"world_size": 2, "tp": 2}, alternatives=({"world_size": 4, "tp": 4},
                                                                      {"world_size": 4, "dp_shard": 2, "tp": 2}),
        implementation="hyper_parallel.recipes.transformer:tensor_parallel", shapes=_TRANSFORMER_SHAPES,
        must_be_one=("cp", "ep"), must_exceed_one=("tp",)),
    Recipe(
        name="M3", title="tensor + sequence parallelism",
        description="TP with the residual stream sharded along the sequence between blocks: norms run on "
                    "sequence shards, each block's input is all-gathered and its output reduce-scattered. "
                    "Norm weights get Partial gradients over tp, which fully_shard sums (RFC requirement 2).",
        matrix_row="M3 | dense | TP >1 | SP 1 | CP 1 | FSDP2 1 | dp_rep 0 | EP 0 | ETP 0 | TP+SP | mini transformer",
        tier="l1", default={"world_size": 2, "tp": 2}, alternatives=({"world_size": 4, "dp_shard": 2, "tp": 2},),
        implementation="hyper_parallel.recipes.transformer:tensor_sequence_parallel", shapes=_SP_SHAPES,
        must_be_one=("cp", "ep"), must_exceed_one=("tp",)),
    Recipe(
        name="M5", title="context parallelism + FSDP",
        description="The sequence split into 2*cp load-balanced chunks; attention all-gathers K/V over cp. "
                    "CP ranks also shard parameters: fsdp = dp_shard * cp.",
        matrix_row="M5 | dense | TP 1 | SP 0 | CP >1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | cp in fsdp, seq_len % 2cp | mini transformer",
        tier="l1", default={"world_size": 2, "cp": 2, "dp_shard": 1},
        alternatives=({"world_size": 4, "dp_shard": 2, "cp": 2},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer", shapes=_TRANSFORMER_SHAPES,
        must_be_one=("tp", "ep", "dp_replicate"), must_exceed_one=("cp",)),
    Recipe(
        name="M6", title="TP + SP + CP + FSDP",
        description="Four dense dims at once (TorchTitan llama3): TP+SP inside each block, CP attention, "
                    "parameters sharded over fsdp = dp_shard * cp with the TP placement kept.",
        matrix_row="M6 | dense | TP >1 | SP 1 | CP >1 | FSDP2 >0 | dp_rep 0 | EP 0 | ETP 0 | seq_len % (tp*2*cp) | mini transformer",
        tier="l1", default={"world_size": 8, "dp_shard": 2, "cp": 2, "tp": 2},
        alternatives=({"world_size": 4, "dp_shard": 1, "cp": 2, "tp": 2},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer", shapes=_SP_SHAPES,
        must_be_one=("ep", "dp_replicate"), must_exceed_one=("tp", "cp")),
    Recipe(
        name="M7", title="HSDP (dp_replicate x fsdp), TP/CP optional",
        description="Parameters sharded within each replica group and replicated across groups: gradients "
                    "reduce-scatter over fsdp, then all-reduce over dp_replicate (RFC test 2).",
        matrix_row="M7 | dense | TP >1 | SP 0..1 | CP 1..>1 | FSDP2 >0 | dp_rep 1 | EP 0 | ETP 0 | HSDP | mini transformer",
        tier="l1", default={"world_size": 4, "dp_replicate": 2, "dp_shard": 2},
        alternatives=({"world_size": 8, "dp_replicate": 2, "dp_shard": 2, "tp": 2},),
        implementation="hyper_parallel.recipes.transformer:fsdp_transformer", shapes=_SP_SHAPES,
        must_be_one=("ep",), must_exceed_one=("dp_replicate",), at_least_one_of=("dp_shard", "cp")),
]}


def get(name: str) -> Recipe:
    key = name.upper()
    if key not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}")
    return RECIPES[key]
