"""Worker for tests/test_devices.py: every recipe that runs on one rank, built and trained while torch's
default device is ``meta``.

A tensor the recipe code creates without naming its device then lands on ``meta`` instead of the run's
device, and the run fails or leaves it there: the check a GPU run needs (there the default device is the CPU
and the mesh's is the GPU), made on this CPU-only machine. Each recipe trains two steps against its
single-process reference; the results go to $HYPER_PARALLEL_RUN_DIR/device_rank0.json.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from case_runner import run_cases
from torch.distributed.tensor import DTensor

from hyper_parallel.mesh_views import build_mesh
from hyper_parallel.recipes import registry
from hyper_parallel.recipes.training import train_and_compare
from hyper_parallel.recipes.worker import load_builder


def one_rank_recipes() -> list[str]:
    names = []
    for name, recipe in registry.RECIPES.items():
        try:
            recipe.validate(world_size=1)
        except ValueError:
            continue
        names.append(name)
    return names


def devices_of(workload) -> list[str]:
    """The device of every tensor a run holds: parameters of both models, the batches, the optimizer's view."""
    tensors = [*workload.model.parameters(), *workload.reference.parameters()]
    tensors += [*workload.inputs, *workload.global_inputs, workload.targets, workload.global_targets]
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors if isinstance(t, torch.Tensor)]
    return sorted({str(t.device) for t in local})


def case(name: str):
    def run() -> dict:
        recipe = registry.get(name)
        dims = recipe.validate(world_size=1)
        views = build_mesh(dims)
        torch.set_default_device("meta")
        try:
            workload = load_builder(recipe.implementation)(dims, views, 0, recipe.options(dims)).to(views.device)
            metrics = train_and_compare(workload, steps=2)
        finally:
            torch.set_default_device(None)
        return {"ok": metrics["ok"], "devices": devices_of(workload), "run_device": str(views.device)}

    return run


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    out = Path(os.environ["HYPER_PARALLEL_RUN_DIR"]) / f"device_rank{dist.get_rank()}.json"
    run_cases({name: case(name) for name in one_rank_recipes()}, "all", out)


if __name__ == "__main__":
    main()
