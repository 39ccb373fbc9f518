"""torchrun entry of the benchmark: ``python -m hyper_parallel.benchmark.worker --world 4 --steps 20``.

For each configuration, one model is built twice from the same initial weights: under our
``fully_shard`` and under ``torch.distributed.fsdp.fully_shard``, on the same mesh (the multi-dim
configuration: on each stack's own meshes, ``configs``), with the same data and optimizer (AdamW). First
each one's first step and ``--cold`` pairs of cold steps, DTensor's caches cleared before each (what a fresh
run pays); after warm-up:

1. one traced step of each (every collective with op, group, bytes, time; saved as
   ``DIR/<config>/<impl>/trace_rank{r}.json``, read like a recipe run's by the launcher's summary
   and the timeline figure);
2. ``MEMORY_STEPS`` steps of each under the memory profiler (peak = resident + transient, see ``measure``);
3. ``--steps`` timed pairs, alternating which implementation goes first (A B, B A, ...), so a slow
   moment of a loaded machine hits both sides of a pair.

Every step of both is a real training step on the same batches, so their losses must agree; the
largest difference is reported. Rank 0 writes ``DIR/bench.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard as torch_fully_shard

from hyper_parallel import sharding_memo, trace
from hyper_parallel.benchmark.configs import BENCH_FILE, IMPLEMENTATIONS, BenchConfig, BenchModel, configurations
from hyper_parallel.benchmark.measure import (
    resident_bytes,
    synchronize,
    timed_step,
    trace_torch_fsdp,
    transient_peak_bytes,
)
from hyper_parallel.devices import backend_for, bind_local_device, default_device_type
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.fsdp.summary import describe_units
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import MeshViews, build_mesh, clear_mesh_caches
from hyper_parallel.models.transformer import Transformer, TransformerConfig, lm_loss, token_batch
from hyper_parallel.parallel.async_tp import parallelize_transformer_async_tp
from hyper_parallel.parallel.tp import parallelize_transformer_tp
from hyper_parallel.rank_lifetime import run_rank
from hyper_parallel.recipes.batches import data_parallel_rows
from hyper_parallel.recipes.moe import MOE_CONFIG, apply_dual_stack_fully_shard, apply_expert_parallel, moe_layers
from hyper_parallel.run_files import TRACE_FORMAT, trace_path

LEARNING_RATE = 1e-3
MEMORY_STEPS = 3
"""Profiled steps per implementation; the smallest peak is reported (see ``measure``: on CPU a
communication buffer freed on gloo's thread is not seen to be freed, which happens at random)."""
# The transformer's logits are a reshape (a view); FSDP2 warns that an in-place op on them would skip
# its pre-backward hook. The loss reads them out of place, so the warning is noise on every rank.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


class Trainer:
    """One implementation's model, optimizer and batch; ``step()`` is one training step."""

    def __init__(self, impl: str, model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> None:
        self.impl, self.model, self.tokens, self.targets = impl, model, tokens, targets
        self.positions = torch.arange(tokens.shape[1], device=tokens.device)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        self.losses: list[float] = []

    def step(self) -> float:
        """One training step; returns the seconds its forward + backward took on this rank."""
        start = time.perf_counter()
        trace.set_phase("forward")  # labels for torch FSDP2's traced step (ours sets them in its hooks)
        loss = lm_loss(self.model(self.tokens, self.positions), self.targets)
        trace.set_phase("backward")
        loss.backward()
        synchronize()
        forward_backward = time.perf_counter() - start
        trace.set_phase("optimizer")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        trace.set_phase("other")
        self.losses.append(float(loss.detach()))
        return forward_backward


def build_model(
    impl: str, base: Transformer, dims: ParallelDims, views: MeshViews, overlap: bool, tp_style: str = "tp"
) -> torch.nn.Module:
    """A copy of ``base`` with TP (if tp > 1, in ``tp_style``, see ``configs.TP_STYLES``) and then one
    fully_shard unit per block + the root.

    Both implementations get the same data-parallel mesh: (dp_replicate, fsdp) for HSDP, the 1-D fsdp
    mesh otherwise. With experts (the multi-dim configuration) ``build_moe_model`` instead.
    """
    model = copy.deepcopy(base)
    if dims.ep > 1:
        build_moe_model(impl, model, dims, views)
    else:
        if tp_style == "async" and impl == "ours":
            parallelize_transformer_async_tp(model, views[MeshDim.TP])
        else:
            parallelize_transformer_tp(model, views[MeshDim.TP], sequence_parallel=tp_style != "tp")
        mesh = views[MeshDim.DP_REPLICATE, MeshDim.FSDP] if dims.dp_replicate > 1 else views[MeshDim.FSDP]
        shard = fully_shard if impl == "ours" else torch_fully_shard
        for layer in model.layers:
            shard(layer, mesh=mesh)
        shard(model, mesh=mesh)
    if impl == "ours":
        model.set_overlap(overlap)
    return model


def build_moe_model(impl: str, model: Transformer, dims: ParallelDims, views: MeshViews) -> None:
    """S2's recipe on ``model``: TP + SP, EP (+ ETP), then fully_shard. Ours as the recipe applies it, on the
    views it hands over (``apply_dual_stack_fully_shard``); torch's FSDP2 on the data dims > 1, the experts
    on ``efsdp`` as torchtitan shards them, their gradients divided by the data shards as ours."""
    parallelize_transformer_tp(model, views[MeshDim.TP], sequence_parallel=True, moe_tokens_replicated=dims.etp > 1)
    apply_expert_parallel(model, dims, views, dispatch="all_to_all")
    if impl == "ours":
        apply_dual_stack_fully_shard(model, dims, views)
        return
    for layer in model.layers:
        if layer in moe_layers(model):
            experts = torch_fully_shard(layer.feed_forward.experts, mesh=views[MeshDim.EFSDP])
            experts.set_gradient_divide_factor(dims.dp_cp)
        torch_fully_shard(layer, mesh=views[MeshDim.FSDP])
    torch_fully_shard(model, mesh=views[MeshDim.FSDP])


def _traced(trainer: Trainer, views: MeshViews) -> list[dict]:
    """One step with every collective recorded (ours records itself; torch's FSDP2 calls are wrapped), and
    the compute between them (ours marks it in its hooks; torch's is marked by ``_compute_spans``)."""
    with trace.record() as recorder:
        trace.set_step(0)
        with trace.TorchCollectiveTracer(views.group_names()):
            if trainer.impl == "torch":
                with trace_torch_fsdp(_fsdp_group_names(views)), _compute_spans(trainer):
                    trainer.step()
            else:
                trainer.step()
    return recorder.events


@contextlib.contextmanager
def _compute_spans(trainer: Trainer) -> Iterator[None]:
    """Torch FSDP2's step measured as ours is: compute runs from the step's start to the optimizer (ours:
    from the root's forward to the end of backward), paused while a traced collective runs, so both
    timelines get a compute strip and their exposed communication is the same measure."""
    original = trainer.optimizer.step

    def optimizer_step(*args, **kwargs):
        with trace.outside_compute(start_after=False):  # backward ended: close the open span
            pass
        return original(*args, **kwargs)

    trainer.optimizer.step = optimizer_step
    with trace.outside_compute(start_after=True):  # open the first span
        pass
    try:
        yield
    finally:
        trainer.optimizer.step = original


def _fsdp_group_names(views: MeshViews) -> dict[tuple[int, ...], str]:
    """Group names for FSDP2's collectives: the data-parallel dims win where a model-parallel dim has the
    same ranks (S2's ep borrows fsdp's), since FSDP2 issues only data-parallel collectives."""
    names = views.group_names()
    for dim in (MeshDim.DP_REPLICATE, MeshDim.FSDP):
        ranks = tuple(views.dims.group_of(dim, dist.get_rank()))
        if len(ranks) > 1:
            names[ranks] = dim
    return names


def _profile(trainer: Trainer, path: Path, steps: int = 3) -> None:
    """torch.profiler over ``steps`` steps; rank 0 writes the operators by self time (where time goes)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(steps):
            trainer.step()
    if dist.get_rank() == 0:
        table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)
        path.write_text(f"{trainer.impl}: {steps} steps on rank 0, operators by self CPU time\n{table}\n")


def run_config(
    config: BenchConfig,
    shape: BenchModel,
    steps: int,
    warmup: int,
    out: Path,
    device_type: str,
    profile: bool = False,
    overlap: bool = True,
    cold: int = 3,
) -> dict:
    """One configuration, ours and torch's FSDP2 built from one model: cold and warm-up steps, each one's traced
    step, memory, then ``steps`` timed steps alternating which goes first; rank 0 adds the units and losses."""
    dims = ParallelDims(**config.degrees)
    views = build_mesh(dims, device_type)
    device = views.device
    model_config = _model_config(config, shape)
    torch.manual_seed(0)
    base = Transformer(model_config).to(device)
    tokens, targets = token_batch(model_config, shape.global_batch, seed=0)
    tokens, targets = data_parallel_rows(tokens, dims).to(device), data_parallel_rows(targets, dims).to(device)
    trainers = {
        impl: Trainer(impl, build_model(impl, base, dims, views, overlap, config.tp_style), tokens, targets)
        for impl in IMPLEMENTATIONS
    }
    del base
    first, cold_steps = cold_pairs(trainers, cold, device)
    for _ in range(warmup):
        for trainer in trainers.values():
            trainer.step()
    rank = dist.get_rank()
    result: dict = {
        "name": config.name,
        "title": config.title,
        "degrees": dims.degrees(),
        "peak_memory": {},
        "first_step_times": first,
        "cold_step_times": cold_steps,
        "step_times": {impl: [] for impl in IMPLEMENTATIONS},
        "forward_backward_times": {impl: [] for impl in IMPLEMENTATIONS},
    }
    _write_traces(trainers, views, out / config.name, rank, dims.world_size)
    _measure_memory(trainers, result)
    for index in range(steps):
        order = IMPLEMENTATIONS if index % 2 == 0 else IMPLEMENTATIONS[::-1]
        for impl in order:
            step_time, forward_backward = timed_step(trainers[impl].step, device)
            result["step_times"][impl].append(step_time)
            result["forward_backward_times"][impl].append(forward_backward)
    if profile:
        for impl, trainer in trainers.items():
            _profile(trainer, out / config.name / f"profile_{impl}.txt")
    if rank == 0:
        result["units"] = describe_units(trainers["ours"].model)
        losses = [trainer.losses for trainer in trainers.values()]
        result["losses"] = dict(zip(IMPLEMENTATIONS, losses))
        result["max_loss_diff"] = max(abs(a - b) for a, b in zip(*losses))
    return result


def _model_config(config: BenchConfig, shape: BenchModel) -> TransformerConfig:
    """The benchmark's transformer at ``shape``, with MoE layers when the configuration has experts."""
    model_config = TransformerConfig(
        vocab_size=shape.vocab_size,
        d_model=shape.d_model,
        n_heads=shape.n_heads,
        n_layers=shape.n_layers,
        hidden=shape.hidden,
        seq_len=shape.seq_len,
    )
    if not config.experts:
        return model_config
    return dataclasses.replace(
        model_config,
        moe_layers=MOE_CONFIG.moe_layers,
        num_experts=shape.num_experts,
        top_k=MOE_CONFIG.top_k,
        moe_hidden=shape.moe_hidden,
        shared_expert=MOE_CONFIG.shared_expert,
    )


def _write_traces(trainers: dict, views, out: Path, rank: int, world_size: int) -> None:
    """One traced step of each implementation, written as ``out/<impl>/`` this rank's trace file."""
    for impl, trainer in trainers.items():
        events = _traced(trainer, views)
        trace_dir = out / impl
        trace_dir.mkdir(parents=True, exist_ok=True)
        payload = {"format": TRACE_FORMAT, "rank": rank, "world_size": world_size, "events": events}
        trace_path(trace_dir, rank).write_text(json.dumps(payload))


def _measure_memory(trainers: dict, result: dict) -> None:
    """Each implementation's resident bytes and smallest transient peak over MEMORY_STEPS steps, every rank's
    gathered, into ``result``."""
    transients: dict[str, list[int]] = {impl: [] for impl in IMPLEMENTATIONS}
    for _ in range(MEMORY_STEPS):
        for impl, trainer in trainers.items():
            transients[impl].append(transient_peak_bytes(trainer.step))
    for impl, trainer in trainers.items():
        resident = resident_bytes(trainer.model, trainer.optimizer)
        result["peak_memory"][impl] = _gather_ints([resident, min(transients[impl])])
        result.setdefault("transient_samples", {})[impl] = _gather_ints(transients[impl])


def cold_pairs(
    trainers: dict[str, Trainer], pairs: int, device: torch.device
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each implementation's first step, then ``pairs`` alternated pairs of cold steps: DTensor's caches are
    cleared before every one of these steps, so each pays the uncached sharding propagation of every op, as
    the first step of a fresh launch does (and a warm-pool run on a mesh shape the pool has not run before:
    its sharding memo answers the others, docs/warm_pool.md)."""
    first: dict[str, float] = {}
    cold: dict[str, list[float]] = {impl: [] for impl in IMPLEMENTATIONS}
    for impl in IMPLEMENTATIONS:
        clear_mesh_caches()
        first[impl] = timed_step(trainers[impl].step, device)[0]
    for index in range(pairs):
        for impl in IMPLEMENTATIONS if index % 2 else IMPLEMENTATIONS[::-1]:
            clear_mesh_caches()
            cold[impl].append(timed_step(trainers[impl].step, device)[0])
    return first, cold


def _gather_ints(values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (rank order)."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, values)
    return gathered


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed pairs per configuration")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cold", type=int, default=3, help="pairs of cold steps (DTensor caches cleared before each)")
    parser.add_argument("--configs", default="", help="comma-separated names (default: all for this world size)")
    parser.add_argument("--model", default="{}", help="JSON object of BenchModel fields to override")
    parser.add_argument("--out", default=os.environ.get("HYPER_PARALLEL_RUN_DIR", "."))
    parser.add_argument("--collective-timeout", type=float, default=300.0)
    parser.add_argument("--profile", action="store_true", help="write DIR/<config>/profile_<impl>.txt (rank 0)")
    parser.add_argument("--no-overlap", action="store_true", help="ours issues every collective synchronously")
    return parser.parse_args(argv)


def run_benchmark(args: argparse.Namespace, device_type: str) -> None:
    """Every chosen configuration on the default process group (already up); rank 0 writes ``bench.json``."""
    out = Path(args.out)
    shape = BenchModel(**json.loads(args.model))
    wanted = [name for name in args.configs.split(",") if name]
    configs = [c for c in configurations(dist.get_world_size()) if c.name in wanted or not (wanted or c.optional)]
    results = []
    for config in configs:
        results.append(
            run_config(
                config,
                shape,
                args.steps,
                args.warmup,
                out,
                device_type,
                args.profile,
                overlap=not args.no_overlap,
                cold=args.cold,
            )
        )
        if dist.get_rank() == 0:
            times = results[-1]["step_times"]
            print(f"{config.name}: {len(times['ours'])} pairs timed", flush=True)
    if dist.get_rank() == 0:
        payload = {
            "world_size": dist.get_world_size(),
            "backend": dist.get_backend(),
            "device": device_type,
            "model": shape.as_dict(),
            "steps": args.steps,
            "warmup": args.warmup,
            "cold": args.cold,
            "overlap": not args.no_overlap,
            "torch": torch.__version__,
            "configs": results,
        }
        (out / BENCH_FILE).write_text(json.dumps(payload, indent=1))


def run_on_warm_rank(argv: list[str]) -> None:
    """The benchmark on a warm-pool rank (``launch.processes.pool_worker``: its group is up). The pool's
    sharding memo is bypassed meanwhile, so the first and cold steps pay DTensor's sharding propagation as a
    fresh launch's do; what they no longer pay is the process's own start (imports, first calls)."""
    with sharding_memo.bypassed():
        run_benchmark(parse_args(argv), default_device_type())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device_type = default_device_type()
    bind_local_device(device_type)
    dist.init_process_group(backend_for(device_type), timeout=datetime.timedelta(seconds=args.collective_timeout))
    try:
        run_benchmark(args, device_type)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    run_rank(main)  # tied to its torchrun agent; leaves without an interpreter teardown that could abort
