"""Fixtures shared by the test modules: every run of the recipe matrix, launched once per session.

A launch costs 20-60 s here, so the runs are grouped into one torchrun launch per world
size and shared: tests/test_recipes.py checks them against the references and hand-derived counts,
tests/test_cost_model.py against the cost model's bytes and memory. Likewise every case of the
fully_shard test matrix runs in one launch per world size (``fully_shard_run4``, ``fully_shard_run8``),
shared by the tests/test_fully_shard_*.py files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fully_shard_expectations import TOLERANCES

import launch
from hyper_parallel import ParallelDims
from hyper_parallel.recipes import RECIPES
from hyper_parallel.recipes.options import OPTION_NAMES
from launch.notebook.workbook import notebooks
from launch.processes.supervisor import torchrun

OVERLAP_OFF = ("M4", "M7", "M6", "S2")

OPTION_RUNS = (
    ("P1", {"world_size": 8, "pp": 2, "dp_shard": 4}),
    ("P1", {"world_size": 4, "pp": 4}),
    ("P1", {"world_size": 4, "pp": 2, "dp_shard": 2, "global_batch": 12, "microbatches": 3}),
    ("M5", {"world_size": 3, "dp_shard": 1, "cp": 3}),
    ("S1", {"world_size": 8, "dp_shard": 8, "ep": 8}),
)
"""Runs whose options are not the defaults (tests/test_recipe_options.py): P1's microbatches adapted to
the mesh (2 rows per dp rank on pp2 x dp_shard4), the default on pp4, given explicitly; M5's sequence on
cp=3 (16 tokens do not cut into 6 chunks) and S1's experts on ep=8 (4 experts do not spread over 8)."""
EXTRA_RUNS = (
    ("S1", {"world_size": 8, "dp_shard": 8, "ep": 2}),
    *((name, {**RECIPES[name].default, "overlap": False}) for name in OVERLAP_OFF),
    ("P1", {**RECIPES["P1"].default, "reshard_after_forward": True}),
    *OPTION_RUNS,
)
"""Runs outside the matrix, in the same launches: S1 on 8 shards pads the router weight ([4, 32] over
8 ranks: 1 row each, 4 of them padding), so FSDP padding is checked against a real run too; the
recipes of ``OVERLAP_OFF`` on their default mesh with every collective synchronous, which
tests/test_overlap.py holds to the same numbers as the default (overlapping) runs; P1 with every layer
resharded after forward (tests/test_pipeline.py: the all-gathers per microbatch it costs); and ``OPTION_RUNS``."""


def matrix() -> list[tuple[str, int, dict]]:
    """(recipe, index, degrees) of every recipe on its default mesh (index 0) and its alternatives."""
    return [
        (recipe.name, index, degrees)
        for recipe in RECIPES.values()
        for index, degrees in enumerate((recipe.default, *recipe.alternatives))
    ]


def run_key(recipe: str, degrees: dict) -> tuple:
    """Runs that are the same computation (same workload, same normalised degrees, same fully_shard
    settings (overlap, reshard_after_forward), same options given) are run once."""
    spec = RECIPES[recipe]
    degrees = dict(degrees)
    settings = degrees.pop("overlap", None), degrees.pop("reshard_after_forward", None)
    options = tuple(sorted((name, degrees.pop(name)) for name in OPTION_NAMES if name in degrees))
    return spec.implementation, tuple(sorted(ParallelDims(**degrees).degrees().items())), settings, options


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
        # one launch runs 30+ recipes at 4 ranks: 20 minutes were not enough at load 900 on 2 cores
        for key, result in zip(keys, launch.run_many([unique[k] for k in keys], out=out, timeout=3600)):
            results[key] = result
    return results


def result_of(recipe: str, degrees: dict, recipe_results) -> launch.RunResult:
    return recipe_results[run_key(recipe, degrees)]


@pytest.fixture
def no_warm_pool():
    """End the warm pool (launch.processes.pool) other tests left running: for tests that watch every process this
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


# ------------------------------------------------------------------ the fully_shard test matrix

FULLY_SHARD_WORKER = Path(__file__).parent / "fully_shard_worker.py"
FULLY_SHARD_LAUNCH_TIMEOUT = {4: 300.0, 8: 360.0}  # the whole matrix took 86-135 s on the 2-core machine


class FullyShardRun:
    """Per-rank results of one launch: ``cases[rank][case name]``."""

    def __init__(self, world_size: int, cases: dict[int, dict], duration: float) -> None:
        self.world_size, self.cases, self.duration = world_size, cases, duration

    def case(self, name: str) -> dict[int, dict]:
        """Every rank's result of ``name``; fails the test with the traceback if the case raised."""
        results = {rank: cases[name] for rank, cases in self.cases.items()}
        assert sorted(results) == list(range(self.world_size))
        for rank, result in sorted(results.items()):
            if not result["ok"]:
                pytest.fail(f"case {name} raised on rank {rank}:\n{result['error']}", pytrace=False)
        return results


def _clean_commit() -> str:
    """HEAD's commit, or a usage error when the tree has uncommitted changes (results would be stale)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        dirty, commit = git("status", "--porcelain", "--untracked-files=no"), git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError) as error:
        raise pytest.UsageError(f"FULLY_SHARD_RESULTS needs a git checkout to key its cache: {error}") from None
    if dirty:
        raise pytest.UsageError(
            "FULLY_SHARD_RESULTS reuses results keyed by commit, and this tree has uncommitted changes: "
            "commit them or unset FULLY_SHARD_RESULTS"
        )
    return commit


def launch_fully_shard_cases(world_size: int, tmp_path_factory) -> FullyShardRun:
    """One torchrun of every case for ``world_size``. With ``FULLY_SHARD_RESULTS=<dir>`` the results go
    to ``<dir>/<commit>/<world_size>`` and are reused by later sessions on the same commit (re-check
    assertions without relaunching); on a tree with uncommitted changes the cache is refused, since the
    results could not be told apart from those of the code checked out."""
    keep = os.environ.get("FULLY_SHARD_RESULTS")
    if keep:
        run_dir = Path(keep) / _clean_commit() / str(world_size)
    else:
        run_dir = tmp_path_factory.mktemp(f"fully_shard_{world_size}")
    if keep and all((run_dir / f"fully_shard_rank{r}.json").exists() for r in range(world_size)):
        return FullyShardRun(
            world_size,
            {r: json.loads((run_dir / f"fully_shard_rank{r}.json").read_text())["cases"] for r in range(world_size)},
            0.0,
        )
    result = torchrun(
        str(FULLY_SHARD_WORKER),
        world_size,
        args=["--cases", "all", "--tolerances", json.dumps(TOLERANCES)],
        timeout=FULLY_SHARD_LAUNCH_TIMEOUT[world_size],
        run_dir=run_dir,
    )
    if not result.ok:
        pytest.fail(f"{world_size}-rank launch failed:\n{result.error}", pytrace=False)
    cases = {}
    for rank in range(world_size):
        path = run_dir / f"fully_shard_rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no results; its log:\n" + "\n".join(result.logs.get(rank, [])[-30:])
        cases[rank] = json.loads(path.read_text())["cases"]
    return FullyShardRun(world_size, cases, result.duration)


@pytest.fixture(scope="session")
def fully_shard_run4(tmp_path_factory) -> FullyShardRun:
    """Every 4-rank case (the @case functions of tests/test_fully_shard_*.py), one launch per session."""
    return launch_fully_shard_cases(4, tmp_path_factory)


@pytest.fixture(scope="session")
def fully_shard_run8(tmp_path_factory) -> FullyShardRun:
    """Every 8-rank case (the @case functions of tests/test_fully_shard_*.py), one launch per session."""
    return launch_fully_shard_cases(8, tmp_path_factory)


# ------------------------------------------------------------------ the workbook, executed once

SAVES_FIGURES = {
    "00_start_here",
    "06_mesh_algebra",
    "07_fully_shard_groupinfo",
    "10_pure_tp_fix",
    "11_planning_at_scale",
}
"""Notebooks whose test also saves the figures (PNG + SVG) to figures_dir; the others only display
them: saving every figure of every run would add a minute to this file on a 2-core machine."""


TEST_PARAMETERS = {"91_performance": {"world_size": 2}}
"""What the tests change of a notebook's defaults: 91's benchmark on 2 ranks (FSDP only; tests/test_bench.py
runs every configuration of 4 ranks)."""


@pytest.fixture(scope="session")
def workbook(tmp_path_factory) -> Path:
    """Every notebook executed once by the workbook runner, two at a time (tests/test_notebooks.py checks
    each, tests/test_capstone.py reads 12's numbers): its output folder (``<name>.ipynb``, ``figures/<name>``,
    ``runs/<name>``)."""
    out = tmp_path_factory.mktemp("workbook")
    parameters = {
        name: {**({} if name in SAVES_FIGURES else {"figures_dir": None}), **TEST_PARAMETERS.get(name, {})}
        for name in (path.stem for path in notebooks())
    }
    # in a process of its own: its worker processes (and multiprocessing's helpers) are no descendants of
    # this one, which tests/test_launcher.py watches for processes that outlive a launch
    script = "import json, sys\nfrom launch.notebook.workbook import run_workbook\n" + (
        "sys.exit(run_workbook(sys.argv[1], parameters=json.loads(sys.argv[2]), jobs=2))"
    )
    subprocess.run([sys.executable, "-c", script, str(out), json.dumps(parameters)], check=False, timeout=3600)
    (root,) = [folder for folder in out.iterdir() if folder.is_dir()]
    return root
