"""Building one plan of ``python -m launch plan``: the DeviceMesh groups of a layout, its cost, its torchrun command.

``make_plan`` validates the degrees against the model (the cost model raises the rule's message), builds
every mesh view on torch's fake process group (one process plays one rank of the world, no worker
starts) and attaches the cost model's memory, communication and step time. Printing it is
``launch.plan.render``; the command line is ``launch.plan.flags``. Torch is imported only when the groups
are built, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from hyper_parallel.cost_model import CostEstimate, ModelConfig, estimate, get_model
from hyper_parallel.cost_model.hardware import DEFAULT_HARDWARE, Hardware
from hyper_parallel.cost_model.layouts import Bandwidth, TimedCollective, check_gpus_per_node
from hyper_parallel.cost_model.step_time import StepEstimate, estimate_step
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.recipes import registry
from hyper_parallel.recipes.run_spec import RunSpec

MESH_DIMS = (
    MeshDim.DP_REPLICATE,
    MeshDim.DP_SHARD,
    MeshDim.CP,
    MeshDim.TP,
    MeshDim.FSDP,
    MeshDim.DP,
    MeshDim.DP_CP,
    MeshDim.EFSDP,
    MeshDim.EP,
    MeshDim.ETP,
)


@dataclass(frozen=True)
class Plan:
    """One layout at scale: the cost model's estimate and the groups read from real DeviceMeshes."""

    cost: CostEstimate
    groups: dict[str, dict]  # mesh dim -> size, count, examples, the rank's group, nodes spanned
    collectives: list[TimedCollective]
    gpus_per_node: int
    bandwidth: Bandwidth
    rank: int
    hardware: Hardware = DEFAULT_HARDWARE
    step: StepEstimate | None = None

    @property
    def dims(self) -> ParallelDims:
        return self.cost.dims

    @property
    def comm_seconds(self) -> float:
        return sum(c.seconds for c in self.collectives)


def mesh_groups(dims: ParallelDims, rank: int, gpus_per_node: int) -> dict[str, dict]:
    """Every mesh dim of size > 1 as built by ``build_mesh`` on the fake process group."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from hyper_parallel.mesh_views import build_mesh  # torch: only when groups are asked for

    if not 0 <= rank < dims.world_size:
        raise ValueError(f"--rank {rank} is outside world_size={dims.world_size}")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process; plan needs its own fake one")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=dims.world_size)
    try:
        views = build_mesh(dims, "cpu")
        groups = {}
        for dim in MESH_DIMS:
            with contextlib.suppress(ValueError):  # efsdp / ep / etp exist only with experts
                size = views[dim].size()
                if size > 1:
                    every = views.all_group_ranks(dim)
                    groups[dim] = {
                        "size": size,
                        "count": len(every),
                        "first_groups": every[:2],
                        "rank_group": dist.get_process_group_ranks(views[dim].get_group()),
                        "nodes_spanned": max(len({r // gpus_per_node for r in ranks}) for ranks in every),
                    }
        return groups
    finally:
        dist.destroy_process_group()


def make_plan(
    config: ModelConfig, dims: ParallelDims, gpus_per_node: int, rank: int = 0, hardware: Hardware = DEFAULT_HARDWARE
) -> Plan:
    """The plan of ``dims`` for ``config``: memory, bytes and step time, and ``rank``'s groups and nodes."""
    check_gpus_per_node(dims.world_size, gpus_per_node)
    cost = estimate(config, dims)
    step = estimate_step(cost, gpus_per_node, hardware)
    return Plan(
        cost,
        mesh_groups(dims, rank, gpus_per_node),
        step.timed,
        gpus_per_node,
        hardware.bandwidth,
        rank,
        hardware,
        step,
    )


def torchrun_command(config: ModelConfig, dims: ParallelDims, gpus_per_node: int, rdzv_endpoint: str) -> str:
    """The multi-node command of ``launch command`` for this layout: the recipe worker when a recipe trains
    this model on these degrees, otherwise the same torchrun line in front of your own training module."""
    from launch.processes.multinode import multinode_command

    nnodes, per_node = max(1, dims.world_size // gpus_per_node), min(gpus_per_node, dims.world_size)
    spec = _recipe_run(config, dims)
    if spec is not None:
        return multinode_command(nnodes, per_node, rdzv_endpoint, spec.worker_args())
    explicit = json.dumps({k: v for k, v in dims.degrees().items() if k != "world_size"})
    return (
        "# no workbook recipe trains this model on these degrees: the same launch for your own trainer, which\n"
        "# builds its meshes with build_mesh(ParallelDims(**degrees))\n"
        + multinode_command(nnodes, per_node, rdzv_endpoint, ["-m", "your_training_module", "--degrees", explicit])
    )


def _recipe_run(config: ModelConfig, dims: ParallelDims) -> RunSpec | None:
    """The run of the recipe whose worker trains exactly this model (an unmodified small preset) on these degrees."""
    recipe = registry.plan_recipe(config.name)
    if recipe is None or config != get_model(config.name):
        return None
    try:
        return RunSpec.resolve(recipe.name, dims.degrees())
    except ValueError:
        return None
