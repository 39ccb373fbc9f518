"""Entry point of every torchrun worker: ``python -m hyper_parallel.recipes.worker --recipe M4 ...``.

Each run is a ``RunSpec`` (run_spec.py): the records of ``--batch`` as the launcher resolved them, or
the one run the flags name (a multi-node command, ``RunSpec.worker_args``). A run builds the meshes,
applies the recipe, trains next to the single-process reference and writes into its run directory
(``--out``, on the node of each rank): ``trace_rank{r}.json`` from every rank and ``metrics.json`` from
rank 0. Rank 0 prints one ``[progress] {...}`` JSON line per step for the
launcher's progress bar. Rank 0 exits with ``EXIT_MISMATCH`` when a run did not match its reference,
so a cluster job (Slurm, Kubernetes) fails on wrong numbers instead of reporting success.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hyper_parallel import link, trace
from hyper_parallel.devices import backend_for, bind_local_device, default_device_type
from hyper_parallel.fsdp import FullyShardModule
from hyper_parallel.fsdp.summary import describe_units
from hyper_parallel.mesh_views import build_mesh
from hyper_parallel.rank_lifetime import run_rank
from hyper_parallel.recipes import registry
from hyper_parallel.recipes.run_spec import RunSpec
from hyper_parallel.recipes.training import train_and_compare
from hyper_parallel.run_files import EXIT_MISMATCH, METRICS_FILE, PROGRESS_PREFIX, trace_path, write_atomic


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", help="one run: the recipe")
    parser.add_argument("--degrees", default="{}", help="one run: JSON object of degrees, e.g. '{\"dp_shard\": 2}'")
    parser.add_argument("--options", default="{}", help="one run: JSON object of options, e.g. '{\"microbatches\": 2}'")
    parser.add_argument("--steps", type=int, help="one run: training steps (default: the recipe's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overlap", choices=("on", "off"), help="one run (default: HYPER_PARALLEL_OVERLAP decides)")
    parser.add_argument(
        "--reshard-after-forward",
        choices=("on", "off"),
        help="one run: every unit below another reshards after forward, or none (default: the recipe decides)",
    )
    parser.add_argument("--out", default=os.environ.get("HYPER_PARALLEL_RUN_DIR", "."))
    parser.add_argument(
        "--link", help="one run: an emulated link, a preset or 'LATENCY,RATE' such as '2ms,1MB/s' (hyper_parallel.link)"
    )
    parser.add_argument(
        "--batch",
        help="several runs in one process group: a JSON file with a list of RunSpec records "
        "(hyper_parallel/recipes/run_spec.py; saves the start-up of a launch per run)",
    )
    parser.add_argument("--collective-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    if (args.recipe is None) == (args.batch is None):
        parser.error("give either --recipe (one run) or --batch (several)")
    return args


def specs_of(args: argparse.Namespace, world_size: int) -> list[RunSpec]:
    """The runs the flags ask for: the batch file's records as written, or the one run of ``--recipe``
    resolved on this launch's ``world_size`` (a hand-written multi-node command gives only what it changes)."""
    if args.batch:
        return [RunSpec.from_json(record) for record in json.loads(Path(args.batch).read_text())]
    return [
        RunSpec.resolve(
            args.recipe,
            {"world_size": world_size, **json.loads(args.degrees)},
            json.loads(args.options),
            steps=args.steps,
            seed=args.seed,
            overlap=None if args.overlap is None else args.overlap == "on",
            reshard_after_forward=None if args.reshard_after_forward is None else args.reshard_after_forward == "on",
            out=args.out,
            link=args.link,
        )
    ]


def apply_unit_settings(model: torch.nn.Module, spec: RunSpec) -> None:
    """The run's fully_shard settings over the recipe's own: ``overlap`` on every unit, and
    ``reshard_after_forward`` on every unit below another (a root keeps its parameters after forward, as
    FSDP2's does: backward needs them first)."""
    units = [module for module in model.modules() if isinstance(module, FullyShardModule)]
    inner = {
        id(sub) for unit in units for sub in unit.modules() if sub is not unit and isinstance(sub, FullyShardModule)
    }
    for unit in units:
        if spec.overlap is not None:
            unit.set_overlap(spec.overlap, recurse=False)
        if spec.reshard_after_forward is not None and (id(unit) in inner or not spec.reshard_after_forward):
            unit.set_reshard_after_forward(spec.reshard_after_forward, recurse=False)


def load_builder(implementation: str):
    module_name, _, function = implementation.partition(":")
    return getattr(importlib.import_module(module_name), function)


def run_one(spec: RunSpec, device_type: str) -> bool:
    """Build, train and check one recipe run; write its trace (every rank) and metrics (rank 0).

    Whether it matched its reference (rank 0 knows; the other ranks return True)."""
    rank, dims, options = dist.get_rank(), spec.dims, spec.options
    if dims.world_size != dist.get_world_size():
        raise ValueError(
            f"run {spec.recipe} is for world_size={dims.world_size}, but this launch has {dist.get_world_size()} ranks"
        )
    recipe = registry.get(spec.recipe)
    views = build_mesh(dims, device_type)
    out = Path(spec.out if spec.out is not None else ".")
    out.mkdir(parents=True, exist_ok=True)
    build = load_builder(recipe.implementation)

    def report(progress: dict) -> None:
        print(PROGRESS_PREFIX + json.dumps({"recipe": recipe.name, **progress}), flush=True)

    with trace.record() as recorder, link.emulating(spec.link):
        workload = build(dims, views, spec.seed, options).to(views.device)
        apply_unit_settings(workload.model, spec)
        metrics = train_and_compare(
            workload,
            spec.steps,
            on_step=report,
            trace_torch_collectives=lambda: trace.TorchCollectiveTracer(views.group_names()),
        )
    recorder.save(trace_path(out, rank))
    if rank == 0:
        metrics = {
            "recipe": recipe.name,
            "degrees": dims.degrees(),
            "steps": spec.steps,
            "seed": spec.seed,
            "options": options.values(),
            "adapted": options.notes(),
            "overlap": next(
                (m._hp_state.settings.overlap for m in workload.model.modules() if isinstance(m, FullyShardModule)),
                None,
            ),
            "backend": dist.get_backend(),
            "link": None if spec.link is None else spec.link.to_json(),
            "units": describe_units(workload.model),
            **metrics,
        }
        write_atomic(out / METRICS_FILE, json.dumps(metrics, indent=1))
        print(
            f"{recipe.name}: max |loss - reference| = {metrics['max_abs_diff']:.3g}, "
            f"max |param - reference| = {metrics['max_param_diff']:.3g}, ok={metrics['ok']}",
            flush=True,
        )
        return bool(metrics["ok"])
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device_type = default_device_type()
    bind_local_device(device_type)
    dist.init_process_group(backend_for(device_type), timeout=datetime.timedelta(seconds=args.collective_timeout))
    matched = []
    try:
        for spec in specs_of(args, dist.get_world_size()):
            matched.append(run_one(spec, device_type))
            dist.barrier()
    finally:
        dist.destroy_process_group()
    if not all(matched):
        print(f"{matched.count(False)} of {len(matched)} run(s) did not match the reference", file=sys.stderr)
        return EXIT_MISMATCH
    return 0


if __name__ == "__main__":
    run_rank(main)  # tied to its torchrun agent; leaves without an interpreter teardown that could abort
