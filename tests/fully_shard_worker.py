"""torchrun worker for the tests/test_fully_shard_*.py files: every case of the fully_shard test matrix
(docs/design.md §3; each case is registered by the tests/test_fully_shard_*.py module that asserts on it, imported below) for
this launch's world size, run in one gloo process group because a torchrun start costs 10-19 s here; each
case trains our ``fully_shard`` next to the single-process reference (and torch FSDP2 where asked, see
fully_shard_training.py) and records per rank its ``numbers`` (difference and tolerance ratio of every
compared tensor), ``facts`` (GroupInfo, layouts, case-specific findings) and the ``collectives`` and
``placements`` trace events (``hyper_parallel.trace``); a case that raises records its traceback and the
others still run (the ranks meet at a barrier between cases; a rank left waiting by an error elsewhere
gives up after ``--collective-timeout`` seconds). Output: ``$HYPER_PARALLEL_RUN_DIR/fully_shard_rank{r}.json``.
Run as ``torchrun --nproc-per-node 4 tests/fully_shard_worker.py --cases all --tolerances '{...}'``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from fully_shard_training import CASES, Result, this_rank
from torch.distributed.tensor import DTensor

from hyper_parallel import trace

CASE_MODULES = (
    "test_fully_shard_data_parallel",  # FSDP, HSDP, mixed precision (vs torch FSDP2)
    "test_fully_shard_local_tp",  # local-tensor TP: sharding inferred off or kept, a rebuilt mesh
    "test_fully_shard_tp",  # torch DTensor TP, experts on (ep, etp), clipping over two meshes (8 ranks)
    "test_fully_shard_accumulation",  # gradient accumulation
    "test_fully_shard_state_dict",  # state dicts
)
"""The test modules whose cases a launch runs: importing one registers its ``@case`` functions in ``CASES``
(the cases are independent of each other and of their order: each seeds its own model and data, and
run_case clears DTensor's caches). They live in tests/ beside this worker (a script's folder is on its
import path), next to the assertions on what they record."""
for module in CASE_MODULES:
    importlib.import_module(module)

# --------------------------------------------------------------------------- driver

COLLECTIVE_KEYS = ("op", "group", "ranks", "bytes", "dtype", "phase", "module", "step")
PLACEMENT_KEYS = ("param", "mesh_dims", "before", "after", "local_shape", "global_shape", "phase", "step")


def clear_dtensor_caches() -> None:
    """Forget DTensor's cached sharding propagations (C++ fast path and Python lru_cache).

    Keeps the cases independent: those caches key on DeviceMesh *equality*, so without this a DTensor
    op on a freshly built but value-equal mesh returns a spec carrying an earlier case's mesh object
    (case ``rebuilt_mesh`` creates that situation on purpose)."""
    torch._C._clear_DTensor_sharding_propagator_cache()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()


def run_case(name: str, fn: Callable, tolerances: dict, run_dir: Path) -> dict:
    res = Result(tolerances, run_dir)
    clear_dtensor_caches()
    start = time.perf_counter()
    error = None
    with trace.record() as recorder:
        try:
            fn(res)
        except Exception:  # recorded per case; the other cases still run
            error = traceback.format_exc()
    events = recorder.events
    dist.barrier()
    return {
        "ok": error is None,
        "error": error,
        "seconds": time.perf_counter() - start,
        "doc": (fn.__doc__ or "").strip(),
        "numbers": res.numbers,
        "facts": res.facts,
        "collectives": [{k: e[k] for k in COLLECTIVE_KEYS} for e in events if e["kind"] == "collective"],
        "placements": [{k: e[k] for k in PLACEMENT_KEYS} for e in events if e["kind"] == "placement"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="all", help="comma-separated case names, or 'all' (for this world size)")
    parser.add_argument(
        "--tolerances", required=True, help='JSON {"fp32": [rtol, atol], "bf16_torch": ..., "bf16_ref": ...}'
    )
    parser.add_argument("--out", default=os.environ.get("HYPER_PARALLEL_RUN_DIR", "."))
    parser.add_argument("--collective-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    tolerances = json.loads(args.tolerances)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.collective_timeout))
    world = dist.get_world_size()
    names = [n for n, (w, _) in CASES.items() if w == world] if args.cases == "all" else args.cases.split(",")
    unknown = [n for n in names if n not in CASES or CASES[n][0] != world]
    if unknown:
        raise SystemExit(f"unknown cases for world size {world}: {unknown}; known: {sorted(CASES)}")
    out = Path(args.out)
    results = {}
    try:
        for name in names:
            results[name] = run_case(name, CASES[name][1], tolerances, out)
            if this_rank() == 0:
                status = "ok" if results[name]["ok"] else "FAILED"
                print(f"[case] {name} {status} {results[name]['seconds']:.2f}s", flush=True)
            if not results[name]["ok"]:
                print(f"[case] {name} rank {this_rank()}:\n{results[name]['error']}", flush=True)
        (out / f"fully_shard_rank{this_rank()}.json").write_text(
            json.dumps({"rank": this_rank(), "world_size": world, "cases": results})
        )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
