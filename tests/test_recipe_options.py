"""A recipe's options on the mesh the user picks: defaults that adapt, explicit values checked.

The expected values are derived here from the rules themselves (a pipeline rank's rows split into equal
microbatches, at least one per stage; the batch over dp; the sequence into 2*cp chunks; the experts over
ep), not read back from ``hyper_parallel.recipes.options``. The runs (``OPTION_RUNS`` of conftest, in the
session's shared launches) are checked against the single-process reference, and the microbatches they
used against the send/recv count of rank 0's trace: stage 0 sends each microbatch's activations forward
and receives its gradient backward, once per microbatch.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from conftest import OPTION_RUNS, result_of

import launch
from hyper_parallel import ParallelDims
from hyper_parallel.recipes import RECIPES
from hyper_parallel.recipes.options import OPTION_NAMES

DEFAULT_MICROBATCHES = RECIPES["P1"].shapes["microbatches"]
DEFAULT_BATCH = RECIPES["P1"].shapes["global_batch"]


def derived_microbatches(global_batch: int, dp: int, stages: int) -> int:
    """The largest count <= the default that splits a dp rank's rows evenly and gives every stage one."""
    rows = global_batch // dp
    return max(m for m in range(1, DEFAULT_MICROBATCHES + 1) if rows % m == 0 and m >= stages)


@pytest.mark.parametrize(
    "recipe, degrees, global_batch, stages",
    [
        ("P1", {"world_size": 8, "pp": 2, "dp_shard": 4}, DEFAULT_BATCH, 2),  # 2 rows per dp rank
        ("P1", {"world_size": 4, "pp": 2, "dp_shard": 2}, DEFAULT_BATCH, 2),
        ("P1", {"world_size": 4, "pp": 4}, DEFAULT_BATCH, 4),
        ("P1-I", {"world_size": 4, "pp": 2, "dp_shard": 2}, DEFAULT_BATCH, 4),
        ("P2", {"world_size": 8, "pp": 2, "dp_shard": 2, "tp": 2}, DEFAULT_BATCH, 2),
    ],
)
def test_default_microbatches_adapt_to_the_mesh(recipe, degrees, global_batch, stages):
    spec, dims = launch.validate(recipe, **degrees)
    options = spec.options(dims)
    assert options.microbatches == derived_microbatches(global_batch, dims.dp, stages)
    assert options.global_batch == global_batch
    adapted = options.microbatches != DEFAULT_MICROBATCHES
    assert ("microbatches" in options.adapted) == adapted


def test_interleaved_on_four_data_parallel_ranks_grows_the_batch():
    """P1-I on pp2 x dp_shard4: 4 stages need 4 rows per dp rank, the default batch gives 2."""
    spec, dims = launch.validate("P1-I", world_size=8, pp=2, dp_shard=4)
    options = spec.options(dims)
    stages, dp = 4, 4
    smallest = min(b for b in range(DEFAULT_BATCH, 10 * DEFAULT_BATCH) if b % dp == 0 and b // dp >= stages)
    assert options.global_batch == smallest == 16
    assert options.microbatches == 4 and set(options.adapted) == {"global_batch"}


@pytest.mark.parametrize(
    "recipe, degrees, option, expected",
    [
        ("M1", {"world_size": 3, "dp_shard": 3}, "global_batch", 18),  # 16 does not split over 3 ranks
        ("S1", {"world_size": 8, "dp_shard": 8, "ep": 8}, "num_experts", 8),  # 4 experts over 8 ranks
        ("M4", {"world_size": 2, "dp_shard": 2}, "global_batch", 16),  # the default fits: kept
        # float8: 16 / 16 ranks = 1 row of 8 tokens, not the 16 _scaled_mm takes; 32 gives 16 tokens a rank
        ("M4-F8", {"world_size": 16, "dp_shard": 16}, "global_batch", 32),
    ],
)
def test_other_defaults_adapt(recipe, degrees, option, expected):
    spec, dims = launch.validate(recipe, **degrees)
    options = spec.options(dims)
    default = spec.shapes[option]
    assert getattr(options, option) == expected
    assert (option in options.adapted) == (expected != default)


@pytest.mark.parametrize(
    "recipe, degrees, given, flag, valid",
    [
        ("P1", {"world_size": 8, "pp": 2, "dp_shard": 4}, {"microbatches": 4}, "--microbatches", "[2]"),
        ("P1", {"world_size": 8, "pp": 2, "dp_shard": 4}, {"microbatches": 1}, "--microbatches", "[2]"),
        ("P1", {"world_size": 4, "pp": 2, "dp_shard": 2}, {"microbatches": 3}, "--microbatches", "[2, 4]"),
        ("M1", {"world_size": 4, "dp_shard": 4}, {"global_batch": 10}, "--global-batch", "[8, 12]"),
        ("M4-F8", {"world_size": 4, "dp_shard": 4}, {"global_batch": 12}, "--global-batch", "[8, 16]"),  # even rows
        (
            "M6",
            {"world_size": 4, "dp_shard": 1, "cp": 2, "tp": 2},
            {"seq_len": 12},
            "--seq-len",
            "[8, 16]",
        ),  # multiples of tp*2*cp = 8
        ("S1", {"world_size": 4, "dp_shard": 4, "ep": 4}, {"num_experts": 6}, "--num-experts", "[4, 8]"),
    ],
)
def test_explicit_values_that_do_not_fit_name_the_flag_and_the_valid_values(recipe, degrees, given, flag, valid):
    with pytest.raises(ValueError) as error:
        launch.validate(recipe, **degrees, **given)
    message = str(error.value)
    assert flag in message and f"one of {valid}" in message, message


def test_valid_microbatches_are_every_fitting_count():
    """The list in the message is every divisor of the rows that gives each stage a microbatch."""
    with pytest.raises(ValueError) as error:
        launch.validate("P1", world_size=2, pp=2, global_batch=24, microbatches=5)
    rows, stages = 24, 2
    assert f"one of {[m for m in range(1, rows + 1) if rows % m == 0 and m >= stages]}" in str(error.value)


def test_adapting_microbatches_asks_the_rules_only_about_counts_a_rank_could_split(monkeypatch):
    """P1 on pp=2 x dp_replicate=3: the batch adapts to 9 (3 rows per rank), no count <= the default of 4
    both splits 3 rows and fills 2 stages, so the nearest above is taken: 3. The candidates are the divisors
    of the rows, so the rules are asked a handful of times (the widget of 09 checks every mesh it offers);
    a scan upwards asked them a million times (15 s) before finding that none above the rows fits."""
    calls = Counter()
    check_model = ParallelDims.check_model

    def counted(self, **shape):
        calls["check_model"] += 1
        return check_model(self, **shape)

    monkeypatch.setattr(ParallelDims, "check_model", counted)
    options = RECIPES["P1"].options(ParallelDims(world_size=6, pp=2, dp_replicate=3))
    rows = options.global_batch // 3
    assert options.microbatches == min(m for m in range(2, rows + 1) if rows % m == 0)
    assert calls["check_model"] <= 4 * (rows + len(OPTION_NAMES))


def test_an_option_the_recipe_does_not_have_is_refused():
    with pytest.raises(ValueError, match=r"M1 has no microbatches option.*--global-batch"):
        launch.validate("M1", world_size=2, dp_shard=2, microbatches=2)
    with pytest.raises(ValueError, match="positive integer"):
        launch.validate("P1", microbatches=0)


def test_cli_refuses_microbatches_that_do_not_fit_before_any_worker_starts():
    done = subprocess.run(
        [sys.executable, "-m", "launch", "run", "P1", "--pp", "2", "--dp-shard", "4", "--microbatches", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--microbatches" in done.stderr and "one of [2]" in done.stderr, done.stderr


def test_cli_check_shows_the_adapted_default():
    done = subprocess.run(
        [sys.executable, "-m", "launch", "check", "--recipe", "P1", "--pp", "2", "--dp-shard", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "microbatches=2 (the default does not fit pp=2 x dp_shard=4" in done.stdout, done.stdout


def expected_options(recipe: str, degrees: dict) -> dict[str, int]:
    """The options a run of OPTION_RUNS must have used, derived from its mesh by the rules above."""
    mesh = {k: v for k, v in degrees.items() if k not in OPTION_NAMES}
    dims = ParallelDims(**mesh)
    shapes = RECIPES[recipe].shapes
    batch = degrees.get("global_batch", shapes["global_batch"])
    expected = {"global_batch": batch}
    if "microbatches" in shapes:
        expected["microbatches"] = degrees.get("microbatches") or derived_microbatches(batch, dims.dp, dims.pp)
    if "seq_len" in shapes:  # the smallest length >= the default that cuts into 2*cp chunks
        expected["seq_len"] = next(n for n in range(shapes["seq_len"], 1000) if n % (2 * dims.cp * dims.tp) == 0)
    if "num_experts" in shapes:
        expected["num_experts"] = next(n for n in range(shapes["num_experts"], 1000) if n % dims.ep == 0)
    return expected


@pytest.mark.distributed
@pytest.mark.parametrize("recipe, degrees", OPTION_RUNS, ids=[f"{r}-{sorted(d.items())}" for r, d in OPTION_RUNS])
def test_runs_with_adapted_or_given_options_match_the_reference(recipe, degrees, recipe_results):
    result = result_of(recipe, degrees, recipe_results)
    assert result.ok, result.error
    for loss, reference in zip(result.metrics["losses"], result.metrics["reference_losses"]):
        assert loss == pytest.approx(reference, rel=1e-5, abs=1e-6)
    assert result.metrics["mismatched_params"] == []
    expected = expected_options(recipe, degrees)
    assert result.metrics["options"] == expected
    shapes = RECIPES[recipe].shapes
    adapted = {name for name, value in expected.items() if name not in degrees and value != shapes[name]}
    assert {note.split("=")[0] for note in result.summary()["adapted"]} == adapted
    if "microbatches" in expected:  # stage 0 sends once per microbatch forward, receives once backward
        sent = Counter((e["op"], e["phase"]) for e in result.traces[0] if e["kind"] == "collective" and e["step"] == 1)
        assert sent[("send", "forward")] == sent[("recv", "backward")] == expected["microbatches"]
