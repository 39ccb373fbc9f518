"""A DCP checkpoint written on one mesh and read on another (notebook 05_hsdp): FSDP on 4 ranks saves, HSDP
on 2 x 2 loads and trains on, and must train as the run that never stopped.

``torch.distributed.checkpoint`` stores each tensor as the pieces its ranks hold plus metadata saying which
piece is which part of the whole; a load asks, for every DTensor of the state it is given, for the part
that rank holds on *its* mesh, and reads it from whichever pieces overlap. So the save's layout (4 shards
of 1/4) and the load's (2 shards of 1/2, twice) need not match: resharding is reading other offsets.
The model is M4's MLP, each block a ``fully_shard`` unit and the root one; Adam, whose moments are
sharded as the parameters are and resharded with them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from hyper_parallel.devices import default_device_type
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch

GLOBAL_BATCH = 16
WORLD_SIZE = 4
WATCHED = "blocks.0.w1.weight"  # the parameter whose pieces the lesson prints


def sharded_model(mesh, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """M4's MLP with a fully_shard unit per block and the root on ``mesh`` (1-D: FSDP; 2-D: HSDP), and Adam."""
    torch.manual_seed(seed)
    model = MLP(MLPConfig())
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train(model, optimizer, steps: int, batch_rank: int, batch_ranks: int) -> list[float]:
    """``steps`` Adam steps on this data-parallel rank's rows of the global batch; the global mean loss of each."""
    device = default_device_type()
    x, y = mlp_batch(MLPConfig(), GLOBAL_BATCH, 0)
    rows = GLOBAL_BATCH // batch_ranks
    x, y = (t[batch_rank * rows : (batch_rank + 1) * rows].to(device) for t in (x, y))
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    return losses


def _pieces(model) -> dict:
    """The watched parameter's mesh, placements and this rank's local shape."""
    parameter = dict(model.named_parameters())[WATCHED]
    if not isinstance(parameter, DTensor):
        raise RuntimeError(f"{WATCHED} is not a DTensor after fully_shard: nothing was sharded")
    return {
        "mesh": dict(zip(parameter.device_mesh.mesh_dim_names, parameter.device_mesh.shape)),
        "placements": [str(p) for p in parameter.placements],
        "local_shape": list(parameter.to_local().shape),
        "global_shape": list(parameter.shape),
    }


def reshard_probe(folder: str, steps_before: int = 2, steps_after: int = 2) -> dict:
    """Train on FSDP over 4 ranks, save with DCP into ``folder`` (shared by the ranks), train on (never
    stopped); then a fresh model on HSDP 2 x 2 (other initial values) loads the checkpoint and trains on."""
    if dist.get_world_size() != WORLD_SIZE:
        raise ValueError(f"the lesson saves on {WORLD_SIZE} ranks and loads on 2 x 2: run it with -n {WORLD_SIZE}")
    device = default_device_type()
    rank = dist.get_rank()
    fsdp = init_device_mesh(device, (WORLD_SIZE,), mesh_dim_names=("fsdp",))
    model, optimizer = sharded_model(fsdp, seed=0)
    before = train(model, optimizer, steps_before, rank, WORLD_SIZE)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
    saved_as = _pieces(model)
    straight = train(model, optimizer, steps_after, rank, WORLD_SIZE)

    hsdp = init_device_mesh(device, (2, WORLD_SIZE // 2), mesh_dim_names=("dp_replicate", "fsdp"))
    fresh, fresh_optimizer = sharded_model(hsdp, seed=1)
    model_state, optimizer_state = get_state_dict(fresh, fresh_optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(fresh, fresh_optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    loaded_as = _pieces(fresh)
    resumed = train(fresh, fresh_optimizer, steps_after, rank, WORLD_SIZE)
    return {"before": before, "straight": straight, "resumed": resumed, "saved_as": saved_as, "loaded_as": loaded_as}
