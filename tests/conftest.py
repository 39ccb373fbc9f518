"""Fixtures shared by the test modules: every run of the recipe matrix, launched once per session.

A launch costs 20-60 s here, so the runs are grouped into one torchrun launch per world
size and shared: tests/test_recipes.py checks them against the references and hand-derived counts,
tests/test_cost_model.py against the cost model's bytes and memory.
"""

from __future__ import annotations

import pytest

import launch
from hyper_parallel import ParallelDims
from hyper_parallel.recipes import RECIPES

OVERLAP_OFF = ("M4", "M7", "M6", "S2")

EXTRA_RUNS = (
    ("S1", {"world_size": 8, "dp_shard": 8, "ep": 2}),
    *((name, {**RECIPES[name].default, "overlap": False}) for name in OVERLAP_OFF),
)
"""Runs outside the matrix, in the same launches: S1 on 8 shards pads the router weight ([4, 32] over
8 ranks: 1 row each, 4 of them padding), so FSDP padding is checked against a real run too; and the
recipes of ``OVERLAP_OFF`` on their default mesh with every collective synchronous, which
tests/test_overlap.py holds to the same numbers as the default (overlapping) runs."""


def matrix() -> list[tuple[str, int, dict]]:
    """(recipe, index, degrees) of every recipe on its default mesh (index 0) and its alternatives."""
    return [
        (recipe.name, index, degrees)
        for recipe in RECIPES.values()
        for index, degrees in enumerate((recipe.default, *recipe.alternatives))
    ]


def run_key(recipe: str, degrees: dict) -> tuple:
    """Runs that are the same computation (same workload, same normalised degrees, same overlap) are run once."""
    spec = RECIPES[recipe]
    degrees = dict(degrees)
    overlap = degrees.pop("overlap", None)
    return spec.implementation, tuple(sorted(ParallelDims(**degrees).degrees().items())), overlap


@pytest.fixture(scope="session")
def recipe_results(tmp_path_factory) -> dict[tuple, launch.RunResult]:
    """Every distinct run of the matrix (and EXTRA_RUNS), one torchrun launch per world size."""
    unique: dict[tuple, dict] = {}
    for recipe, _, degrees in [*matrix(), *((name, -1, degrees) for name, degrees in EXTRA_RUNS)]:
        unique.setdefault(run_key(recipe, degrees), {"recipe": recipe, "steps": 2, **degrees})
    by_world: dict[int, list[tuple]] = {}
    for key, spec in unique.items():
        by_world.setdefault(spec["world_size"], []).append(key)
    results = {}
    for world, keys in sorted(by_world.items()):
        out = tmp_path_factory.mktemp(f"world{world}")
        for key, result in zip(keys, launch.run_many([unique[k] for k in keys], out=out, timeout=1200)):
            results[key] = result
    return results


def result_of(recipe: str, degrees: dict, recipe_results) -> launch.RunResult:
    return recipe_results[run_key(recipe, degrees)]


@pytest.fixture
def no_warm_pool():
    """End the warm pool (launch.pool) other tests left running: for tests that watch every process this
    one starts."""
    launch.shutdown_pool()
    yield


def process_alive(pid: int) -> bool:
    """A zombie counts as gone (an orphan may wait a while for init to reap it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
