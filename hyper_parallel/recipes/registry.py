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
]}


def get(name: str) -> Recipe:
    key = name.upper()
    if key not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}")
    return RECIPES[key]
