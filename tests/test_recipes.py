"""Every recipe of the matrix through `launch.run` on its default mesh and its alternative meshes.

Checks per run: losses each step and parameters after the last step equal the single-process
reference (fp32, rtol 1e-5); the same recipe gives the same losses on every mesh (the global
batch is fixed per recipe); and the collectives of one step, read from rank 0's trace, equal the
counts derived by hand below.
"""
from __future__ import annotations

from collections import Counter

import pytest

import launch
from hyper_parallel import ParallelDims
from hyper_parallel.recipes import RECIPES

LAYERS = 2          # TransformerConfig.n_layers and MLPConfig.n_blocks
UNITS = LAYERS + 1  # one fully_shard unit per block + the root


def runs():
    for recipe in RECIPES.values():
        for index, degrees in enumerate((recipe.default, *recipe.alternatives)):
            marks = [pytest.mark.distributed] + ([getattr(pytest.mark, recipe.tier)] if recipe.tier else [])
            label = "-".join(f"{k}{v}" for k, v in degrees.items() if k != "world_size" and v != 1)
            yield pytest.param(recipe.name, index, degrees, marks=marks, id=f"{recipe.name}-w{degrees['world_size']}-{label}")


_results: dict[tuple[str, int], launch.RunResult] = {}


def result_of(recipe: str, index: int, degrees: dict, tmp_path_factory) -> launch.RunResult:
    key = (recipe, index)
    if key not in _results:
        out = tmp_path_factory.mktemp(f"{recipe}-{index}")
        _results[key] = launch.run(recipe, steps=2, out=out, timeout=600, **degrees)
    return _results[key]


def step_collectives(result: launch.RunResult, step: int = 1) -> Counter:
    return Counter((e["op"], e["group"], e["phase"]) for e in result.traces[0]
                   if e["kind"] == "collective" and e["step"] == step)


def expected_collectives(recipe: str, d: dict) -> Counter:
    """Hand-derived collectives of one training step on rank 0.

    fully_shard with sharding: every unit all-gathers in forward, the non-root units again in backward
    (the root keeps its parameters), and each unit reduce-scatters once; HSDP adds one all-reduce
    per unit over dp_replicate. Without sharding (M1-M3): one all-reduce per unit over the whole data-
    parallel group, or nothing when it has one rank. TP without SP (M2): forward all-reduces after the
    embedding and after wo and w2 of each layer (2L+1) and all-gathers the vocab-sharded logits once;
    backward all-reduces the input gradient of each colwise layer (wq, wk, wv, w1: 4 per layer) and of
    the head (1). TP with SP: forward all-gathers each block input twice per layer plus the head input
    and the logits (2L+2) and reduce-scatters after wo, w2 and the embedding (2L+1); backward mirrors
    it (2L+1 of each); the norm weights' Partial gradients add one tp all-reduce per unit. CP: one K/V
    all-gather per attention in forward, one reduce-scatter in backward.
    """
    dims = ParallelDims(**d)  # only to infer dp_shard
    tp, cp, dp_replicate, fsdp = dims.tp, dims.cp, dims.dp_replicate, dims.dp_shard * dims.cp
    expected: Counter = Counter()
    if recipe in ("M1", "M2", "M3"):
        dp = dp_replicate * fsdp
        if dp > 1:
            group = "dp_replicate+fsdp"
            expected[("all_reduce", group, "backward")] = UNITS
    else:
        expected[("all_gather", "fsdp", "forward")] = UNITS
        expected[("all_gather", "fsdp", "backward")] = UNITS - 1
        expected[("reduce_scatter", "fsdp", "backward")] = UNITS
        if dp_replicate > 1:
            expected[("all_reduce", "dp_replicate", "backward")] = UNITS
    sequence_parallel = recipe in ("M3", "M5", "M6", "M7")
    if tp > 1 and sequence_parallel:
        expected[("all_gather", "tp", "forward")] = 2 * LAYERS + 2
        expected[("reduce_scatter", "tp", "forward")] = 2 * LAYERS + 1
        expected[("all_gather", "tp", "backward")] = 2 * LAYERS + 1
        expected[("reduce_scatter", "tp", "backward")] = 2 * LAYERS + 1
        expected[("all_reduce", "tp", "backward")] = UNITS
    elif tp > 1:
        expected[("all_reduce", "tp", "forward")] = 2 * LAYERS + 1
        expected[("all_gather", "tp", "forward")] = 1
        expected[("all_reduce", "tp", "backward")] = 4 * LAYERS + 1
    if cp > 1:
        expected[("all_gather", "cp", "forward")] = LAYERS
        expected[("reduce_scatter", "cp", "backward")] = LAYERS
    return expected


@pytest.mark.parametrize("recipe, index, degrees", list(runs()))
def test_recipe_matches_reference(recipe, index, degrees, tmp_path_factory):
    result = result_of(recipe, index, degrees, tmp_path_factory)
    assert result.ok, result.error
    metrics = result.metrics
    assert len(metrics["losses"]) == 2
    for loss, reference in zip(metrics["losses"], metrics["reference_losses"]):
        assert loss == pytest.approx(reference, rel=1e-5, abs=1e-6)
    assert metrics["mismatched_params"] == []
    assert set(result.traces) == set(range(degrees["world_size"]))
    if recipe in ("M1", "M2", "M3", "M4", "M5", "M6", "M7"):
        assert step_collectives(result) == expected_collectives(recipe, degrees)


@pytest.mark.distributed
@pytest.mark.parametrize("recipe", [r.name for r in RECIPES.values() if r.alternatives])
def test_same_recipe_same_losses_on_every_mesh(recipe, tmp_path_factory):
    spec = RECIPES[recipe]
    meshes = (spec.default, *spec.alternatives)
    results = [result_of(recipe, index, degrees, tmp_path_factory) for index, degrees in enumerate(meshes)]
    assert all(r.ok for r in results), [r.error for r in results]
    first = results[0].metrics
    for other in results[1:]:
        assert other.metrics["reference_losses"] == first["reference_losses"]
        assert other.metrics["losses"] == pytest.approx(first["losses"], rel=1e-5)
