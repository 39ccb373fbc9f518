"""``torch.compile`` of each block under ``fully_shard`` (notebook 07_fully_shard_groupinfo): what it changes.

torchtitan compiles every transformer block on its own (``block.compile(fullgraph=True)``, its
``apply_compile``) and shards around it. The block's forward becomes one captured graph (and AOTAutograd's
its backward), while fully_shard's hooks, which gather before the block and reduce after it, run outside
the graph: the collectives are fully_shard's own, in the same order with the same bytes, and only the
compute between them is compiled. The probe trains M4's MLP both ways on the fsdp mesh and returns, for
each: the collectives of every step (op, group, unit, phase, bytes), the losses, and for the compiled run
the graphs dynamo captured and the graph breaks it met. The backend is ``aot_eager`` (dynamo and
AOTAutograd capture the forward and backward graphs and run them with eager kernels): what compiling does
to the trace without the seconds of code generation that ``inductor`` spends on a CPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from hyper_parallel import trace
from hyper_parallel.devices import default_device_type
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch

GLOBAL_BATCH = 16


def _trained(mesh, compiled: bool, backend: str, steps: int) -> dict:
    torch.manual_seed(0)
    model = MLP(MLPConfig())
    for block in model.blocks:
        if compiled:
            block.compile(backend=backend, fullgraph=True)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = mlp_batch(MLPConfig(), GLOBAL_BATCH, 0)
    rows = GLOBAL_BATCH // dist.get_world_size()
    rank = dist.get_rank()
    x, y = (t[rank * rows : (rank + 1) * rows].to(mesh.device_type) for t in (x, y))
    losses = []
    with trace.record() as recorder:
        for step in range(steps):
            trace.set_step(step)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    collectives = [
        [e["op"], e["group"], e["module"], e["phase"], e["bytes"], e["step"]]
        for e in recorder.events
        if e.get("kind") == "collective" and e.get("phase") != "init"
    ]
    return {"losses": losses, "collectives": collectives}


def compile_probe(steps: int = 2, backend: str = "aot_eager") -> dict:
    """M4's MLP eager and with each block compiled (``backend``), both under fully_shard on all ranks."""
    if GLOBAL_BATCH % dist.get_world_size():
        raise ValueError(f"{GLOBAL_BATCH} rows do not split over {dist.get_world_size()} ranks; use 1, 2, 4, 8 or 16")
    from torch._dynamo.utils import counters

    mesh = init_device_mesh(default_device_type(), (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    eager = _trained(mesh, compiled=False, backend=backend, steps=steps)
    counters.clear()
    torch._dynamo.reset()
    compiled = _trained(mesh, compiled=True, backend=backend, steps=steps)
    compiled["graphs"] = int(counters["stats"]["unique_graphs"])
    compiled["graph_breaks"] = int(sum(counters["graph_break"].values()))
    return {"backend": backend, "eager": eager, "compiled": compiled}
