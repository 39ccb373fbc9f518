"""What one rank holds, measured part by part: the run behind notebook 02_memory's predictions.

On every rank of an initialised process group, ``memory_probe`` trains M4's MLP (``models.mlp``, the
recipe's shapes and batch) with our ``fully_shard`` over all ranks (every block, then the root) and
Adam, and reads, in bytes of this rank:

    parameters, gradients, optimizer   the distinct storages behind the sharded parameters, their
                                       gradients after backward, and Adam's exp_avg and exp_avg_sq
                                       (padding included, as fully_shard allocates; Adam's 4-byte
                                       ``step`` counters are left out, as the cost model does)
    kept_gathered                      parameters the modules still hold unsharded when forward ends
                                       (the root always; every unit with reshard_after_forward=False)
    saved_activations                  the largest micro-batch's tensors autograd saved for backward,
                                       parameters excluded (``saved_activation_bytes``)
    all_gathers, reduce_scatters       collectives of the last step, from the trace

``checkpointed`` wraps every block in ``torch.utils.checkpoint`` (recomputed in backward),
``micro_batches`` splits the rank's rows into that many forwards and backwards per step (gradient
accumulation; by default each backward reduce-scatters, ``sync_last_micro_batch_only`` reduces once). Allocator statistics are not used: on CPU torch keeps none, and what autograd saves is
what activation memory is.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from hyper_parallel import trace
from hyper_parallel.devices import default_device_type
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch

GLOBAL_BATCH = 16
"""M4's global batch (recipes/dense.py): every rank trains on GLOBAL_BATCH / world_size rows."""


def _storage(tensor: torch.Tensor) -> torch.UntypedStorage:
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).untyped_storage()


def distinct_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a unit's shards share one flat buffer)."""
    storages = {}
    for tensor in tensors:
        storage = _storage(tensor)
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


class CheckpointedBlock(nn.Module):
    """A block whose activations are recomputed in backward: only its input is saved."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)


def new_model(seed: int = 0, checkpointed: bool = False) -> MLP:
    """M4's MLP; ``checkpointed``: every block under activation checkpointing (same parameters)."""
    torch.manual_seed(seed)
    model = MLP(MLPConfig())
    if checkpointed:
        model.blocks = nn.ModuleList(CheckpointedBlock(block) for block in model.blocks)
    return model


def saved_activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The loss of one forward and the bytes of the distinct tensors autograd saved for its backward,
    the model's parameters (gathered or not) excluded."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        parameters = {_storage(p).data_ptr() for p in model.parameters()}
        storage = _storage(tensor)
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = F.mse_loss(model(x), y)
    return loss, sum(saved.values())


def rank_rows(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of M4's batch."""
    x, y = mlp_batch(MLPConfig(), GLOBAL_BATCH, 0)
    rows = GLOBAL_BATCH // world_size
    return x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]


def memory_probe(
    reshard_after_forward: bool = True,
    checkpointed: bool = False,
    micro_batches: int = 1,
    sync_last_micro_batch_only: bool = False,
    steps: int = 2,
) -> dict[str, int]:
    """Train and measure (module docstring); every rank returns its own numbers.
    ``sync_last_micro_batch_only``: ``set_requires_gradient_sync(False)`` for every micro-batch but the
    last, so gradients are reduced once per step (as torchtitan accumulates)."""
    if GLOBAL_BATCH % (dist.get_world_size() * micro_batches):
        raise ValueError(
            f"{GLOBAL_BATCH} rows do not split into {dist.get_world_size()} ranks x {micro_batches} micro-batches"
        )
    device = default_device_type()
    mesh = init_device_mesh(device, (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    model = new_model(checkpointed=checkpointed)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = (t.to(device) for t in rank_rows(dist.get_rank(), dist.get_world_size()))
    rows = len(x) // micro_batches
    found: dict[str, int] = {}
    with trace.record() as recorder:
        for step in range(steps):
            trace.set_step(step)
            saved = []
            for micro in range(micro_batches):
                part = slice(micro * rows, (micro + 1) * rows)
                loss, nbytes = saved_activation_bytes(model, x[part].clone(), y[part].clone())
                saved.append(nbytes)
                found["kept_gathered"] = distinct_bytes(p for p in model.parameters() if not isinstance(p, DTensor))
                if sync_last_micro_batch_only:
                    model.set_requires_gradient_sync(micro == micro_batches - 1)
                (loss / micro_batches).backward()
            found["gradients"] = distinct_bytes(p.grad for p in model.parameters())
            optimizer.step()
            optimizer.zero_grad()
    found["parameters"] = distinct_bytes(model.parameters())
    found["optimizer"] = distinct_bytes(
        value for state in optimizer.state.values() for name, value in state.items() if name != "step"
    )
    found["saved_activations"] = max(saved)
    last = [e for e in recorder.events if e.get("kind") == "collective" and e["step"] == steps - 1]
    found["all_gathers"] = sum(e["op"] == "all_gather" for e in last)
    found["reduce_scatters"] = sum(e["op"] == "reduce_scatter" for e in last)
    return found
