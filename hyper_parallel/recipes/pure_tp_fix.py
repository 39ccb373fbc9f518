"""What every rank of notebooks/10_pure_tp_fix runs: local-tensor TP + SP on the MLP with
``fully_shard(enable_param_shard=False)``, trained next to the single-process reference twice, without and
with the partial-gradient fix (``parallelize_mlp_local(..., mark_partial_grads=...)``), in one launch.

    %%torchrun -n 4 --send out_dir,steps,degrees                  (the notebook: the warm pool's ranks)
    train_both(out_dir, steps, degrees)
    launch.torchrun("hyper_parallel.recipes.pure_tp_fix", 4, args=[OUT, STEPS, '{"dp_shard": 2, "tp": 2}'])

Each run writes ``OUT/without_fix`` and ``OUT/with_fix``: every rank's trace, and rank 0's metrics.json
with ``replica_spread``, the largest difference between the tp ranks' copies of each tp-Replicate
parameter (copies that should be identical).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import Replicate

from hyper_parallel import trace
from hyper_parallel.devices import backend_for, bind_local_device, default_device_type, seeded_on_host
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.fsdp.summary import describe_units
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import MeshViews, build_mesh
from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch
from hyper_parallel.parallel.tp_local import parallelize_mlp_local
from hyper_parallel.rank_lifetime import run_rank
from hyper_parallel.recipes.batches import data_parallel_rows
from hyper_parallel.recipes.training import Workload, train_and_compare
from hyper_parallel.run_files import METRICS_FILE, trace_path

GLOBAL_BATCH = 16


def replica_spread(model: nn.Module, views: MeshViews) -> dict[str, float]:
    """Largest difference between the tp ranks' copies of each tp-Replicate parameter."""
    tp = views[MeshDim.TP]
    spread = {}
    for name, p in model.named_parameters():
        if dict(zip(p.device_mesh.mesh_dim_names, p.placements)).get(MeshDim.TP, Replicate()) != Replicate():
            continue
        local = p.to_local().detach().contiguous()
        copies = [torch.empty_like(local) for _ in range(tp.size())]
        dist.all_gather(copies, local, group=tp.get_group())
        spread[name] = max((c - copies[0]).abs().max().item() for c in copies)
    return spread


def train_pure_tp(dims: ParallelDims, views: MeshViews, steps: int, fixed: bool) -> tuple[nn.Module, dict]:
    """One run: the model parallelized, wrapped and trained next to its reference; ``fixed`` is the only
    difference between the notebook's two runs."""
    config = MLPConfig()
    with seeded_on_host(0):
        model = MLP(config)
    reference = copy.deepcopy(model)
    model = parallelize_mlp_local(model.to(views.device), views[MeshDim.TP], mark_partial_grads=fixed)
    mesh = views[MeshDim.DP_REPLICATE, MeshDim.FSDP]
    for block in model.blocks:
        fully_shard(block, mesh=mesh, enable_param_shard=False)
    fully_shard(model, mesh=mesh, enable_param_shard=False)
    x, y = mlp_batch(config, GLOBAL_BATCH, 0)
    rows = (data_parallel_rows(x, dims),), data_parallel_rows(y, dims)
    workload = Workload(model, reference, *rows, (x,), y, loss_fn=F.mse_loss).to(views.device)
    return model, train_and_compare(workload, steps)


def train_both(out: str | Path, steps: int, degrees: dict[str, int]) -> list[str]:
    """Both runs on the process group this rank is in (a ``%%torchrun`` cell's, or ``main``'s): each writes
    ``out/<run>``; the runs whose trace this rank saved, in order."""
    out, rank = Path(out), dist.get_rank()
    dims = ParallelDims(world_size=dist.get_world_size(), **degrees)
    views = build_mesh(dims, default_device_type())
    written = []
    for fixed in (False, True):
        run_dir = out / ("with_fix" if fixed else "without_fix")
        run_dir.mkdir(parents=True, exist_ok=True)
        with trace.record() as recorder:
            model, metrics = train_pure_tp(dims, views, steps, fixed)
        spread = replica_spread(model, views)
        recorder.save(trace_path(run_dir, rank))
        if rank == 0:
            _write_metrics(run_dir, metrics, dims, steps, model, spread, fixed)
        dist.barrier()
        written.append(run_dir.name)
    return written


def main(argv: list[str] | None = None) -> int:
    out, steps, degrees = sys.argv[1:] if argv is None else argv
    device_type = default_device_type()
    bind_local_device(device_type)
    dist.init_process_group(backend_for(device_type))
    try:
        train_both(out, int(steps), json.loads(degrees))
    finally:
        dist.destroy_process_group()
    return 0


def _write_metrics(run_dir: Path, metrics: dict, dims: ParallelDims, steps: int, model, spread, fixed: bool) -> None:
    metrics.update(
        recipe="pure TP " + ("with" if fixed else "without") + " the fix",
        degrees=dims.degrees(),
        steps=steps,
        units=describe_units(model),
        replica_spread=spread,
    )
    (run_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=1))
    print(
        f"{'with' if fixed else 'without'} the fix: ok={metrics['ok']}, max |loss - reference| = "
        f"{metrics['max_abs_diff']:.3g}, {len(metrics['mismatched_params'])} parameters differ from the reference"
        " (which of them drift apart between the TP ranks is another question: the replica spread below)",
        flush=True,
    )


if __name__ == "__main__":
    run_rank(main)
