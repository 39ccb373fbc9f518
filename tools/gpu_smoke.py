"""``make gpu-smoke``: what one GPU can check, in one script (under 8 minutes on one GPU), one JSON of results.

Without a GPU it stops at once (exit 2) and says why. ``--rehearse-on-cpu`` runs every check on the CPU and
gloo instead: how a machine without a GPU keeps this script working (tests/test_gpu_smoke.py).

1. references: the single-process reference of each model the recipes train (MLP, dense and MoE transformer)
   for 3 SGD steps on the GPU next to the same on the CPU, from the same initial weights and batch (drawn on
   the host): losses within the recipes' own fp32 tolerance (rtol 1e-5, atol 1e-6).
2. world 1 on NCCL: every recipe that accepts world_size=1, in one launch on one warm worker
   (``launch.run_many``), each against its single-process reference on the GPU.
3. multi-rank shapes on torch's threaded process group (each rank a thread of this process, all on the one
   GPU): the recipes whose collectives that group offers (it has no send/recv, so no pipeline), each
   against its reference.
4. the bench's compute part: the bench model's forward, backward and AdamW step on the GPU in fp32 and under
   bf16 autocast, median ms per step, and the bf16 first-step loss against fp32's.

Usage: python tools/gpu_smoke.py --out runs/gpu-smoke.json [--quick] [--rehearse-on-cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

RTOL, ATOL = 1e-5, 1e-6  # hyper_parallel.recipes.training's
BF16_LOSS_RTOL = 2**-4  # a sanity bound: a few bf16 roundings (2^-8 each) through a small transformer
QUICK_WORLD_ONE = ("A-FSDP2", "B-3", "C-MoE")
THREADED = ("M1", "M4", "M2", "M3", "M3-A", "M5", "M5-U", "M6", "M6-A", "M7", "S1", "S2", "S3")
QUICK_THREADED = ("M4", "M2")


def refuse_without_gpu() -> str | None:
    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
    return (
        f"make gpu-smoke needs a CUDA GPU, and torch {torch.__version__} ({build} build) sees none "
        "(torch.cuda.is_available() is False). Run it where nvidia-smi lists a GPU, with a CUDA build of torch "
        "(make install picks one when nvidia-smi is found); --rehearse-on-cpu runs the same checks on the CPU."
    )


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.cuda.synchronize(device)


def train_reference(model: torch.nn.Module, batch: tuple, loss_fn, lr: float, device: torch.device) -> list[float]:
    model = copy.deepcopy(model).to(device)
    inputs, targets = (tuple(x.to(device) for x in batch[0]), batch[1].to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(3):
        loss = loss_fn(model(*inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def references(device: torch.device) -> list[dict]:
    """Each model family's reference on ``device`` against the same on the host."""
    from hyper_parallel.devices import HOST, seeded_on_host
    from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch
    from hyper_parallel.models.transformer import Transformer, lm_loss, token_batch
    from hyper_parallel.recipes.moe import MOE_CONFIG
    from hyper_parallel.recipes.transformer import DENSE_CONFIG

    rows = []
    for name, build, batch, loss_fn, lr in (
        ("MLP", lambda: MLP(MLPConfig()), lambda: _mlp_batch(mlp_batch), F.mse_loss, 0.05),
        ("transformer", lambda: Transformer(DENSE_CONFIG), lambda: _lm_batch(token_batch, DENSE_CONFIG), lm_loss, 0.5),
        ("MoE transformer", lambda: Transformer(MOE_CONFIG), lambda: _lm_batch(token_batch, MOE_CONFIG), lm_loss, 0.5),
    ):
        with seeded_on_host(0):
            model = build()
        data = batch()
        host, here = train_reference(model, data, loss_fn, lr, HOST), train_reference(model, data, loss_fn, lr, device)
        ok = all(abs(a - b) <= ATOL + RTOL * abs(b) for a, b in zip(here, host))
        rows.append({"model": name, "losses": here, "host_losses": host, "ok": ok})
    return rows


def _mlp_batch(mlp_batch) -> tuple:
    from hyper_parallel.models.mlp import MLPConfig

    x, y = mlp_batch(MLPConfig(), 8, 0)
    return (x,), y


def _lm_batch(token_batch, config) -> tuple:
    tokens, targets = token_batch(config, 8, 0)
    return (tokens,), targets


def one_rank_recipes() -> list[str]:
    from hyper_parallel.recipes import registry

    names = []
    for name, recipe in registry.RECIPES.items():
        with contextlib.suppress(ValueError):
            recipe.validate(world_size=1)
            names.append(name)
    return names


def world_one(names: list[str]) -> list[dict]:
    """Every recipe in ``names`` on one rank, in one launch (NCCL on a GPU, gloo on the CPU)."""
    import launch

    results = launch.run_many([{"recipe": name, "world_size": 1, "steps": 3} for name in names], timeout=900)
    return [
        {"recipe": r.recipe, "ok": r.ok, "max_abs_diff": r.metrics.get("max_abs_diff"), "error": r.error}
        for r in results
    ]


def threaded(names: list[str], device_type: str) -> list[dict]:
    """Each recipe at its default degrees with every rank a thread of this process (torch's threaded group)."""
    from torch.testing._internal.distributed import multi_threaded_pg

    from hyper_parallel.recipes import registry

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    multi_threaded_pg._install_threaded_pg()
    try:
        return [_threaded_run(registry.get(name), device_type, multi_threaded_pg) for name in names]
    finally:
        multi_threaded_pg._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)


def _threaded_run(recipe, device_type: str, multi_threaded_pg) -> dict:
    with tempfile.TemporaryDirectory(prefix="hp-smoke-") as folder:
        return _threaded_run_in(recipe, device_type, multi_threaded_pg, Path(folder))


def _threaded_run_in(recipe, device_type: str, multi_threaded_pg, out: Path) -> dict:
    """One recipe on threads, its run files in ``out`` (a folder the caller removes once metrics are read)."""
    import torch.distributed as dist

    from hyper_parallel.recipes.run_spec import RunSpec
    from hyper_parallel.recipes.worker import run_one

    world = recipe.default["world_size"]
    store, errors = dist.HashStore(), []
    spec = RunSpec.resolve(recipe.name, recipe.default, steps=3, seed=0, out=out)

    def rank_main(rank: int) -> None:
        try:
            dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
            run_one(spec, device_type)
            with contextlib.suppress(AttributeError):  # torch 2.11's threaded world has no `comms` to destroy
                dist.destroy_process_group()
        except Exception:
            errors.append(traceback.format_exc(limit=4))
            multi_threaded_pg.ProcessLocalGroup.exception_handle(None)

    start = time.perf_counter()
    ranks = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(world)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join()
    multi_threaded_pg.ProcessLocalGroup.reset()
    metrics = json.loads((out / "metrics.json").read_text()) if not errors else {}
    return {
        "recipe": recipe.name,
        "world_size": world,
        "ok": bool(metrics.get("ok")) and not errors,
        "max_abs_diff": metrics.get("max_abs_diff"),
        "seconds": time.perf_counter() - start,
        "error": errors[0] if errors else None,
    }


def bench_compute(device: torch.device, steps: int) -> dict:
    """The bench model's training step on ``device`` alone: fp32 and bf16 autocast."""
    from hyper_parallel.benchmark.configs import BenchModel
    from hyper_parallel.devices import seeded_on_host
    from hyper_parallel.models.transformer import Transformer, TransformerConfig, lm_loss, token_batch

    shape = BenchModel()
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    config = TransformerConfig(**{k: v for k, v in shape.as_dict().items() if k in fields})
    with seeded_on_host(0):
        base = Transformer(config)
    tokens, targets = (t.to(device) for t in token_batch(config, shape.global_batch, 0))
    result = {}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model = copy.deepcopy(base).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        times, first_loss = [], None
        for step in range(steps + 2):
            synchronize(device)
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = lm_loss(model(tokens), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            synchronize(device)
            if step >= 2:  # two warm-up steps
                times.append(time.perf_counter() - start)
            first_loss = loss.item() if first_loss is None else first_loss
        result[label] = {"median_ms": 1e3 * statistics.median(times), "first_loss": first_loss}
    fp32, bf16 = result["fp32"]["first_loss"], result["bf16"]["first_loss"]
    result["ok"] = abs(bf16 - fp32) <= BF16_LOSS_RTOL * abs(fp32)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/gpu-smoke.json", help="the JSON of results")
    parser.add_argument("--quick", action="store_true", help="a few recipes per check (the rehearsal's test)")
    parser.add_argument("--rehearse-on-cpu", action="store_true", help="every check on the CPU and gloo")
    args = parser.parse_args(argv)
    if not args.rehearse_on_cpu and (reason := refuse_without_gpu()):
        print(reason, file=sys.stderr)
        return 2
    device_type = "cpu" if args.rehearse_on_cpu else "cuda"
    device = torch.device(device_type) if args.rehearse_on_cpu else torch.device("cuda", torch.cuda.current_device())
    start = time.perf_counter()
    report: dict = {
        "device": "cpu (rehearsal)" if args.rehearse_on_cpu else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    sections = (
        ("references", lambda: references(device)),
        ("world_one", lambda: world_one(list(QUICK_WORLD_ONE) if args.quick else one_rank_recipes())),
        ("threaded", lambda: threaded(list(QUICK_THREADED if args.quick else THREADED), device_type)),
        ("bench_compute", lambda: bench_compute(device, steps=3 if args.quick else 20)),
    )
    for name, check in sections:  # the JSON after each: a run cut short by a lease still says what it found
        report[name] = check()
        report["seconds"] = time.perf_counter() - start
        Path(args.out).write_text(json.dumps(report, indent=1))
    checks = [*report["references"], *report["world_one"], *report["threaded"], report["bench_compute"]]
    report["ok"] = all(check["ok"] for check in checks)
    Path(args.out).write_text(json.dumps(report, indent=1))
    failed = [c.get("recipe") or c.get("model") or "bench_compute" for c in checks if not c["ok"]]
    print(
        f"gpu-smoke on {report['device']}: {len(checks) - len(failed)} of {len(checks)} checks passed in "
        f"{report['seconds']:.0f} s; bench step fp32 {report['bench_compute']['fp32']['median_ms']:.1f} ms, "
        f"bf16 {report['bench_compute']['bf16']['median_ms']:.1f} ms"
        + (f"; FAILED: {failed}" if failed else "")
        + f"\nresults: {args.out}"
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
