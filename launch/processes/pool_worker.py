"""One rank of the warm pool (``launch.processes.pool``): stays up between runs and takes its tasks from the kernel.

    python -m hyper_parallel.rank_lifetime -m launch.processes.pool_worker     (started by ``launch.processes.pool.Pool``)

It connects to the kernel's listener (address and key from the environment), then for each task:

1. ranks ``>= world_size`` of the task sit it out; the others build a fresh gloo process group on
   their own prefix of the agent's store (a pool of 8 serves a run of 2: ranks 0-1 form its group),
   and no rank goes on until every rank has connected it (``INIT_BARRIER_ENV``);
2. DTensor's sharding cache and DeviceMesh's stack are cleared and the RNGs reseeded, so a run sees
   what it would see in a fresh torchrun launch; only the sharding decisions of earlier runs stay, without
   their meshes (``hyper_parallel.sharding_memo``): a run on meshes of the same shape does not pay DTensor's
   uncached sharding propagation again, and computes the same numbers;
3. the task runs: recipe runs (``hyper_parallel.recipes.worker.run_one``, which records its own trace),
   the benchmark (``hyper_parallel.benchmark.worker.run_on_warm_rank``) or a notebook cell's code
   (``%%torchrun``) in a namespace kept between cells, with ``rank`` and ``world_size`` defined; the value
   of a cell's last expression travels back (``torch.save`` bytes, read with ``weights_only=True``, else
   its ``repr``);
4. everything the run created is released (``release_run``): the caches that hold its meshes, the
   hooks that tie its modules into reference cycles the garbage collector cannot see, then the process
   group and every subgroup; what survives (no cell names kept) is frozen out of the garbage collector's
   walks (``freeze_survivors``); the rank reports ``{"ok": ...}`` or the traceback.

Why step 4 matters: a gloo process group owns its threads (``pt_gloo_runloop``, ``gloo_tcp_loop``),
its sockets and listening ports until the Python object is freed; ``destroy_process_group()``
only unregisters it (``shutdown``/``abort`` on gloo leave both, measured with torch 2.13). A
DeviceMesh keeps its subgroups in ``_pg_registry``; DTensor's sharding and redistribution caches keep
the meshes; and a ``register_post_accumulate_grad_hook`` bound method keeps an FSDP state and its
modules alive through the C++ side of a tensor, where ``gc`` cannot see the cycle. Without step 4 every
recipe run left ~27 threads, ~37 fds and 9 listening sockets per rank, and idle workers kept spinning.
Between runs a rank owns no process group at all and blocks in ``recv``: idle means idle.

Why step 1 waits: gloo's ``connectFullMesh`` returns on a rank once that rank's own connections are up,
while its peers may still be making theirs. A rank that then finishes its task at once (a cell's
``rank``, or one that raises) and frees its group closes connections a peer is still counting on: the
peer fails with "Connection closed by peer", and a rank waiting for *that* peer to connect waits the
whole collective timeout (measured here: 8-rank cells of ``rank`` under load, one in two stranded a rank).
torch's own store-based barrier after every group it creates (``TORCH_DIST_INIT_BARRIER=1``, for
``init_process_group`` and ``new_group``) closes that window; a rank that fails before it still strands
its peers, which the kernel ends (``launch.processes.pool.RENDEZVOUS_GRACE_SECONDS``).

Output lines go to the rank's log as usual; the kernel's supervisor follows those files. Runs inside
the kernel's Python process never: torch is imported here, in the ranks.
"""

from __future__ import annotations

import ast
import base64
import datetime
import gc
import io
import json
import os
import sys
import traceback
from multiprocessing.connection import Client

import torch
import torch.distributed as dist

from hyper_parallel import sharding_memo
from hyper_parallel.benchmark.worker import run_on_warm_rank
from hyper_parallel.mesh_views import clear_mesh_caches
from hyper_parallel.recipes.run_spec import RunSpec
from hyper_parallel.recipes.worker import run_one  # imported while the ranks start, not in the first run
from launch.processes.pool_listener import ADDRESS_ENV, KEY_ENV, RENDEZVOUS

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=300)
INIT_BARRIER_ENV = "TORCH_DIST_INIT_BARRIER"
"""torch's switch ("1") for a store-based barrier at the end of ``init_process_group`` and ``new_group``."""
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = "nccl" if DEVICE == "cuda" else "gloo"
OWN_TASKS = ("recipes", "bench")
"""Tasks that keep nothing of theirs after the run (a cell's names are the user's)."""


def _fresh_state(seed: int) -> None:
    clear_mesh_caches()
    torch.manual_seed(seed)


def _drop_grad_hooks() -> None:
    """Empty every tensor's post-accumulate-grad hooks: a bound method stored there keeps its object (an
    FSDP state, its modules, meshes and groups) alive from the C++ side, a cycle ``gc`` cannot break."""
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj._post_accumulate_grad_hooks:
            obj._post_accumulate_grad_hooks.clear()


def release_run(recipes: bool) -> None:
    """Free what a run created, so a rank's threads, fds and sockets after run N equal those after run 2.

    After recipe runs nothing of the run is kept, so their tensors' hooks go too; a cell's names stay
    (objects a cell keeps are the user's), only the caches and the process groups are released."""
    clear_mesh_caches()
    if recipes:
        _drop_grad_hooks()
    if dist.is_initialized():
        dist.destroy_process_group()
    _collect_garbage()


def freeze_survivors() -> None:
    """Move every object alive now out of the cyclic collector (``gc.freeze``), after a release that left
    nothing of the run: what survives is the worker's own (modules, torch's state, the sharding memo), and
    each later release (``gc.collect`` passes, the hook scan) then walks the next run's objects only, not
    the ~290,000 of an imported torch (S2, 4 ranks: 0.2 s of CPU per rank and release, measured under
    load). Never while a cell's names are kept: a cycle among frozen objects is never collected."""
    gc.freeze()


MAX_GC_PASSES = 10


def _collect_garbage() -> None:
    """``gc.collect()`` until a pass finds nothing. A run's meshes form cycles (a mesh and the meshes
    flattened from it point at each other) that C++ objects (autograd graphs holding DTensors) keep
    reachable until the pass that frees those objects: after an M2 run two meshes, and their groups,
    survive one pass and none survive two (torch 2.13)."""
    for _ in range(MAX_GC_PASSES):
        if not gc.collect():
            return


def _run_cell(code: str, namespace: dict) -> object:
    """Execute ``code``; the value of its last line when that is an expression (as a notebook cell)."""
    tree = ast.parse(code, mode="exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<%%torchrun cell>", "exec"), namespace)
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), "<%%torchrun cell>", "eval"), namespace)


def _encode(value: object) -> dict:
    """The value as ``torch.save`` bytes when the kernel can read them back with weights_only=True."""
    if value is None:
        return {"value": None}
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    except Exception:  # not a tensor / container of them / plain data: its text instead
        return {"repr": repr(value)}
    return {"value": base64.b64encode(buffer.getvalue()).decode()}


def main() -> int:
    os.environ[INIT_BARRIER_ENV] = "1"  # forced: the pool's groups are torn down at once (step 1)
    host, port = os.environ[ADDRESS_ENV].rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ[KEY_ENV]))
    rank = int(os.environ["RANK"])
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    conn.send_bytes(json.dumps({"hello": rank, "pid": os.getpid()}).encode())
    sharding_memo.install()
    clear_mesh_caches()  # finds torch's caches before they are frozen (mesh_views scans what gc lists)
    _collect_garbage()
    freeze_survivors()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=COLLECTIVE_TIMEOUT
    )
    namespace: dict = {}
    while True:
        task = json.loads(conn.recv_bytes())
        if task["kind"] == "exit":
            return 0
        if task["kind"] == "forget":  # the kernel moved on to another notebook: its cells' names go
            namespace.clear()
            release_run(recipes=True)
            freeze_survivors()
            conn.send_bytes(json.dumps({"ok": True}).encode())
            continue
        world = task["world_size"]
        if rank >= world:
            conn.send_bytes(json.dumps({"ok": True, "idle": True}).encode())
            continue
        reply: dict = {"ok": True}
        stage = RENDEZVOUS
        try:
            dist.init_process_group(
                BACKEND,
                store=dist.PrefixStore(task["prefix"], store),
                rank=rank,
                world_size=world,
                timeout=COLLECTIVE_TIMEOUT,
            )
            stage = "run"
            _fresh_state(task.get("seed", 0))
            if task["kind"] == "recipes":
                for record in task["specs"]:
                    run_one(RunSpec.from_json(record), DEVICE)
            elif task["kind"] == "bench":
                run_on_warm_rank(task["args"])
            else:
                namespace.update(rank=rank, world_size=world, torch=torch, dist=dist)
                reply.update(_encode(_run_cell(task["code"], namespace)))
        except BaseException:  # reported to the kernel; once every rank has replied, the pool and its names stay
            reply = {"ok": False, "stage": stage, "traceback": traceback.format_exc()}
        finally:
            release_run(task["kind"] in OWN_TASKS)
            if not namespace:
                freeze_survivors()
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send_bytes(json.dumps(reply).encode())


if __name__ == "__main__":
    raise SystemExit(main())
