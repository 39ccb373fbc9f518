"""The recipe matrix as data: what each recipe is, which degrees it allows, its shapes.

Importing this module does not import torch, so the launcher validates a run in the parent process
in a fraction of a second; the worker imports the recipe's ``implementation`` ("module:function").

This module holds ``Recipe`` (with its validation rules) and the lookup; the rows themselves are in
``matrix_dense``, ``matrix_pipeline``, ``matrix_moe`` and ``matrix_tiers`` (what they share in
``matrix_shapes``), gathered here into ``RECIPES`` in that order. A row owns everything keyed by its recipe
(torchtitan's ``ModelSpec`` is the model): what its implementation builds (``workload``), the code a lesson
shows, its tier, whether ``launch plan`` prints its worker; docs/recipes.md lists the files a new recipe
touches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import DEGREE_KEYS, WORLD_FACTORS, degrees_label
from hyper_parallel.recipes.matrix_dense import DENSE_ROWS
from hyper_parallel.recipes.matrix_moe import MOE_ROWS
from hyper_parallel.recipes.matrix_pipeline import PIPELINE_ROWS
from hyper_parallel.recipes.matrix_tiers import TIER_ROWS
from hyper_parallel.recipes.options import RunOptions, resolve
from hyper_parallel.recipes.workload_facts import WorkloadFacts


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    description: str
    matrix_row: str  # the completeness-matrix row this recipe covers
    tier: str  # CI tier marker of its runs: l0, l1, l2, or "" (no tier: run by the whole suite only)
    default: dict[str, int]  # world_size and degrees of the default run
    alternatives: tuple[dict[str, int], ...]  # other valid meshes the tests also run
    implementation: str  # "module:function" building the workload inside a worker
    workload: WorkloadFacts  # what that function builds, as data (the cost model and the tests read it)
    code: tuple[str, ...] = ()  # the functions it calls that a lesson shows with it ("module:function")
    torch_calls: tuple[tuple[str, str], ...] = ()  # (our call, the torch call it makes or stands for): a lesson's table
    plan_command: bool = False  # `launch plan` prints this recipe's worker for layouts of its workload's preset
    shapes: dict = field(default_factory=dict)  # keyword arguments of ParallelDims.check_model (the defaults)
    must_be_one: tuple[str, ...] = ()
    must_exceed_one: tuple[str, ...] = ()
    at_least_one_of: tuple[str, ...] = ()  # at least one of these degrees must be > 1
    steps: int = 3

    def resolve_degrees(self, given: Mapping[str, int | None]) -> dict[str, int]:
        """The degrees of a run: this recipe's default when none are given; otherwise the given ones, with
        world_size (when not given) the product of the dense degrees given (``--tp 4`` alone: 4 ranks,
        dp_shard 1). ep and etp borrow ranks and do not count; given alone they keep the default's world."""
        degrees = {name: value for name, value in given.items() if value is not None}
        if not degrees:
            return dict(self.default)
        if "world_size" not in degrees:
            if any(name in degrees for name in WORLD_FACTORS):
                degrees["world_size"] = math.prod(max(degrees.get(name, 1), 1) for name in WORLD_FACTORS)
            else:  # only ep / etp given: they borrow ranks of the recipe's default world
                degrees["world_size"] = self.default["world_size"]
        return degrees

    def validate(self, **degrees: int) -> ParallelDims:
        """The ParallelDims of a run of this recipe, or ``ValueError`` naming the broken rule (the options
        left at their defaults: a default that does not fit the mesh adapts, see ``options``)."""
        dims = self.check_degrees(**degrees)
        self.options(dims)
        return dims

    def check_degrees(self, **degrees: int) -> ParallelDims:
        """The ParallelDims of ``degrees`` under this recipe's rules on degrees (its model's shapes are the
        options' rules: ``options``), or ``ValueError`` naming the broken rule."""
        unknown = set(degrees) - set(DEGREE_KEYS)
        if unknown:
            raise ValueError(f"unknown degree(s) {sorted(unknown)}; known: {list(DEGREE_KEYS)}")
        merged = {**{k: v for k, v in self.default.items() if k == "world_size"}, **degrees}
        if "world_size" not in merged:
            raise ValueError("world_size is required")
        dims = ParallelDims(**merged)
        if dims.ulysses > 1 and "ulysses" not in self.must_exceed_one:
            two_d = [r.name for r in RECIPES.values() if "ulysses" in r.must_exceed_one]
            raise ValueError(
                f"recipe {self.name} ({self.title}) does not split the sequence over a ulysses dim: it needs "
                f"ulysses=1, got ulysses={dims.ulysses}; 2-D sequence (Ulysses x ring) recipes: {', '.join(two_d)}"
            )
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
                    f"recipe {self.name} ({self.title}) needs {name} > 1, got {name}={getattr(dims, name)}: "
                    f"set --{name.replace('_', '-')} ({name}=) to 2 or more"
                )
        if self.at_least_one_of and all(getattr(dims, n) == 1 for n in self.at_least_one_of):
            raise ValueError(
                f"recipe {self.name} ({self.title}) needs at least one of {list(self.at_least_one_of)} > 1"
            )
        return dims

    def options(self, dims: ParallelDims, **given: int | None) -> RunOptions:
        """This recipe's knobs on ``dims`` (``hyper_parallel.recipes.options``): the ``given`` ones checked,
        the others adapted to the mesh; then the model's remaining shape rules (heads, layers, hidden sizes)."""
        options = resolve(self.name, self.shapes, dims, **given)
        dims.check_model(**{**self.shapes, **options.values()})
        return options

    def constraints(self) -> str:
        parts = [f"{n}=1" for n in self.must_be_one] + [f"{n}>1" for n in self.must_exceed_one]
        if self.at_least_one_of:
            parts.append(" or ".join(f"{n}>1" for n in self.at_least_one_of))
        return ", ".join(parts)


RECIPES: dict[str, Recipe] = {row["name"]: Recipe(**row) for row in [*DENSE_ROWS, *PIPELINE_ROWS, *MOE_ROWS]}
TIERS = [Recipe(**row) for row in TIER_ROWS]
RECIPES.update({recipe.name: recipe for recipe in TIERS})


NOT_RUNNABLE: dict[str, str] = {
    name: (
        f"{name} is not runnable on this stack: its dispatch and combine kernels need CUDA GPUs and NVSHMEM "
        "(GPU-initiated transfers over NVLink / RDMA), and this stack trains on CPU with gloo. Where it would "
        "plug in: the EP dispatch of hyper_parallel/parallel/ep/, a subclass of ExpertParallelExperts whose "
        "forward(routed, counts) sends each expert its rows and returns them combined, chosen by "
        "parallelize_moe(dispatch=...) as 'all_gather' is; run S1 (all-to-all dispatch) or S3 (all-gather) instead"
    )
    for name in ("DeepEP", "HybridEP")
}
"""Appendix-B rows of the matrix that cannot run here: the recipe name and the sentence that refuses it."""


def plan_recipe(preset: str) -> Recipe | None:
    """The recipe whose worker ``launch plan`` prints for a layout of the cost model's ``preset`` (None: no recipe
    trains it, e.g. a model at scale)."""
    return next((r for r in RECIPES.values() if r.plan_command and r.workload.preset == preset), None)


def get(name: str) -> Recipe:
    by_key = {key.upper(): recipe for key, recipe in RECIPES.items()}
    refused = {key.upper(): reason for key, reason in NOT_RUNNABLE.items()}
    if name.upper() in refused:
        raise ValueError(refused[name.upper()])
    if name.upper() not in by_key:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}")
    return by_key[name.upper()]


TABLE_MARKER = "<!-- generated by hyper_parallel.recipes.registry.markdown_table; tests/test_docs.py checks it -->\n"
"""The line above the table in docs/recipes.md (``make docs`` rewrites what follows it, up to a blank line)."""


def markdown_table() -> str:
    """The matrix as the Markdown table docs/recipes.md shows (tests/test_docs.py keeps the two equal)."""
    rows = ["| recipe | tier | what | default ranks: dims | constraints |", "|---|---|---|---|---|"]
    for recipe in RECIPES.values():
        rows.append(
            f"| {recipe.name} | {recipe.tier or '-'} | {recipe.title} | {recipe.default['world_size']}: "
            f"{degrees_label(recipe.default, sep=' x ')} "
            f"| {recipe.constraints() or '-'} |"
        )
    for name, reason in NOT_RUNNABLE.items():
        rows.append(f"| {name} | - | not runnable here: {reason.split(': ', 1)[1].split('. ')[0]} | - | - |")
    return "\n".join(rows)
