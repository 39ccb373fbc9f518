"""``python -m launch plan``: a layout of up to thousands of ranks, checked and costed in one process.

    python -m launch plan --world 4096 --dp-replicate 8 --dp-shard 16 --cp 2 --tp 16 --model llama-8b-like
    python -m launch plan --world 4096 --tp 8 --model llama-8b-like --gpus-per-node 8 --compare

Validates the degrees with ``ParallelDims`` and the model's shapes (the messages of ``launch check``;
exit status 2 when invalid), builds every DeviceMesh view on torch's fake process group (one process
plays rank ``--rank`` of the world, no worker starts), and prints each dim's group size, example rank
lists read from the DeviceMeshes, which groups cross node boundaries for ``--gpus-per-node``, the cost
model's per-rank memory and per-step communication (``hyper_parallel.cost_model``), and the multi-node
torchrun command. ``--compare`` ranks every valid layout of the same world size; ``--json`` prints
all of it as one JSON document.
"""
from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import dataclass

from hyper_parallel.cost_model import CLI_MODELS, PRECISIONS, CostEstimate, ModelConfig, estimate, get_model
from hyper_parallel.cost_model.layouts import (Bandwidth, RankedLayout, TimedCollective, check_gpus_per_node,
                                               rank_layouts, timed_collectives)
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes import registry

MESH_DIMS = ("dp_replicate", "dp_shard", "cp", "tp", "fsdp", "dp", "dp_cp", "efsdp", "ep", "etp")
RECIPE_OF_MODEL = {"small": "C", "small-moe": "C-MoE", "small-mlp": "M4"}
"""The recipe whose worker trains a small preset on any mesh its shapes admit (for the torchrun command)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan subcommand's own flags (the degrees come from ``launch.cli``)."""
    parser.add_argument("--model", default="small", choices=CLI_MODELS, help="model preset (default: small)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default: 8)")
    parser.add_argument("--seq-len", type=int, help="override the preset's sequence length")
    parser.add_argument("--batch", type=int, help="override the preset's global batch (sequences per step)")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), help="override the preset's precision")
    parser.add_argument("--rank", type=int, default=0, help="the rank whose groups are shown (default: 0)")
    parser.add_argument("--compare", action="store_true", help="rank every valid layout of this world size")
    parser.add_argument("--sort", choices=("time", "memory"), default="time", help="--compare order (default: time)")
    parser.add_argument("--top", type=int, default=10, help="--compare: layouts shown (default: 10)")
    parser.add_argument("--memory-gib", type=float, default=80.0, help="--compare: memory per rank (default: 80)")
    parser.add_argument("--intra-node-gbs", type=float, default=Bandwidth.intra_node / 1e9,
                        help="GB/s per rank inside a node")
    parser.add_argument("--inter-node-gbs", type=float, default=Bandwidth.inter_node / 1e9,
                        help="GB/s per rank across nodes")
    parser.add_argument("--rdzv-endpoint", default="$MASTER_ADDR:29500")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")


@dataclass(frozen=True)
class Plan:
    cost: CostEstimate
    groups: dict[str, dict]               # mesh dim -> size, count, examples, the rank's group, nodes spanned
    collectives: list[TimedCollective]
    gpus_per_node: int
    bandwidth: Bandwidth
    rank: int

    @property
    def dims(self) -> ParallelDims:
        return self.cost.dims

    @property
    def comm_seconds(self) -> float:
        return sum(c.seconds for c in self.collectives)


def model_from_args(args: argparse.Namespace) -> ModelConfig:
    config = get_model(args.model)
    changes = {"seq_len": args.seq_len, "global_batch": args.batch,
               "precision": PRECISIONS[args.precision] if args.precision else None}
    return config.replace(**{k: v for k, v in changes.items() if v is not None})


def mesh_groups(dims: ParallelDims, rank: int, gpus_per_node: int) -> dict[str, dict]:
    """Every mesh dim of size > 1 as built by ``ParallelDims.build_mesh`` on the fake process group."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if not 0 <= rank < dims.world_size:
        raise ValueError(f"--rank {rank} is outside world_size={dims.world_size}")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process; plan needs its own fake one")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=dims.world_size)
    try:
        views = dims.build_mesh("cpu")
        groups = {}
        for dim in MESH_DIMS:
            with contextlib.suppress(ValueError):  # efsdp / ep / etp exist only with experts
                size = views[dim].size()
                if size > 1:
                    every = views.all_group_ranks(dim)
                    groups[dim] = {
                        "size": size, "count": len(every), "first_groups": every[:2],
                        "rank_group": dist.get_process_group_ranks(views[dim].get_group()),
                        "nodes_spanned": max(len({r // gpus_per_node for r in ranks}) for ranks in every)}
        return groups
    finally:
        dist.destroy_process_group()


def make_plan(config: ModelConfig, dims: ParallelDims, gpus_per_node: int, rank: int = 0,
              bandwidth: Bandwidth = Bandwidth()) -> Plan:
    check_gpus_per_node(dims.world_size, gpus_per_node)
    cost = estimate(config, dims)
    return Plan(cost, mesh_groups(dims, rank, gpus_per_node), timed_collectives(cost, gpus_per_node, bandwidth),
                gpus_per_node, bandwidth, rank)


def torchrun_command(config: ModelConfig, dims: ParallelDims, gpus_per_node: int, rdzv_endpoint: str) -> str:
    """The multi-node command of ``launch command`` for this layout: the recipe worker when a recipe trains
    this model on these degrees, otherwise the same torchrun line in front of your own training module."""
    from launch.cli import multinode_command
    nnodes, per_node = max(1, dims.world_size // gpus_per_node), min(gpus_per_node, dims.world_size)
    explicit = json.dumps({k: v for k, v in dims.degrees().items() if k != "world_size"})
    recipe = _recipe_training(config, dims)
    if recipe is not None:
        worker = ["-m", "hyper_parallel.recipes.worker", "--recipe", recipe, "--degrees", explicit,
                  "--steps", str(registry.get(recipe).steps)]
        return multinode_command(nnodes, per_node, rdzv_endpoint, worker)
    return ("# no workbook recipe trains this model on these degrees: the same launch for your own trainer, which\n"
            "# builds its meshes with ParallelDims(**degrees).build_mesh()\n"
            + multinode_command(nnodes, per_node, rdzv_endpoint, ["-m", "your_training_module", "--degrees", explicit]))


def _recipe_training(config: ModelConfig, dims: ParallelDims) -> str | None:
    """The recipe whose worker trains exactly this model (an unmodified small preset) on these degrees."""
    recipe = RECIPE_OF_MODEL.get(config.name)
    if recipe is None or config != get_model(config.name):
        return None
    try:
        registry.get(recipe).validate(**dims.degrees())
    except ValueError:
        return None
    return recipe


def _ranks(ranks: list[int]) -> str:
    if len(ranks) <= 8:
        return str(ranks)
    stride = ranks[1] - ranks[0]
    regular = all(b - a == stride for a, b in zip(ranks, ranks[1:]))
    shape = f"stride {stride}" if regular else "irregular"
    return f"[{ranks[0]}, {ranks[1]}, {ranks[2]}, ..., {ranks[-1]}] ({len(ranks)} ranks, {shape})"


def plan_json(plan: Plan, command: str) -> dict:
    cost = plan.cost
    return {
        "degrees": plan.dims.degrees(), "model": cost.config.name, "parameters": cost.parameter_count,
        "seq_len": cost.config.seq_len, "global_batch": cost.config.global_batch,
        "precision": cost.config.precision.name, "gpus_per_node": plan.gpus_per_node, "rank": plan.rank,
        "groups": plan.groups, "memory": cost.memory.as_dict(),
        "communication": [c.__dict__ for c in plan.collectives], "comm_seconds": plan.comm_seconds,
        "assumptions": assumptions(plan.cost.config, plan.bandwidth), "command": command,
    }


def assumptions(config: ModelConfig, bandwidth: Bandwidth) -> list[str]:
    p = config.precision
    return [f"precision {p.name}: sharded parameters and gradients {p.storage} B/element, all-gathers and "
            f"activations {p.compute} B, gradient reduction {p.reduce} B, optimizer state {p.optimizer_state} B "
            f"per parameter element",
            "memory: sharded state exact (padding included); activations estimated (no recomputation, fused "
            "attention); see hyper_parallel.cost_model.memory",
            "communication: bytes per collective as traced (full buffers); EP rows assume balanced routing",
            "time: " + bandwidth.describe()]


def print_plan(plan: Plan, command: str) -> None:
    from hyper_parallel.viz.style import fmt_bytes
    cost, dims = plan.cost, plan.dims
    nodes, per_node = max(1, dims.world_size // plan.gpus_per_node), min(plan.gpus_per_node, dims.world_size)
    print(f"plan: {cost.config.name} on {dims.world_size} ranks ({nodes} node(s) x {per_node})")
    print(f"  {cost.config.description}; {cost.parameter_count:.3g} parameters")
    print("valid: " + dims.describe())
    print(f"\ngroups (read from DeviceMeshes on a fake process group; rank {plan.rank}'s group and the first group):")
    rows = [(dim, str(g["size"]), str(g["count"]),
             f"{g['nodes_spanned']}" + (" (crosses)" if g["nodes_spanned"] > 1 else ""),
             _ranks(g["rank_group"]), _ranks(g["first_groups"][0])) for dim, g in plan.groups.items()]
    _table(("dim", "size", "groups", "nodes/group", f"rank {plan.rank}'s group", "first group"), rows)
    crossing = [dim for dim, g in plan.groups.items() if g["nodes_spanned"] > 1]
    print(f"groups crossing node boundaries with {plan.gpus_per_node} GPUs per node: {', '.join(crossing) or 'none'}")
    print("\nmemory per rank: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in cost.memory.as_dict().items()))
    print("\ncommunication of one step on every rank:")
    rows = [(c.op, c.group, c.phase, str(c.count), fmt_bytes(c.bytes), fmt_bytes(c.wire_bytes),
             "yes" if c.crosses_nodes else "no", f"{c.seconds * 1e3:.2f}") for c in plan.collectives]
    _table(("op", "group", "phase", "calls", "bytes", "wire bytes", "crosses", "ms"), rows)
    print(f"total: {plan.comm_seconds * 1e3:.1f} ms per step")
    print("\nassumptions:\n" + "\n".join(f"  - {line}" for line in assumptions(cost.config, plan.bandwidth)))
    print(f"\nmulti-node command (run on every node):\n{command}")


def print_compare(ranked: list[RankedLayout], dims: ParallelDims, top: int, memory_gib: float, sort: str) -> None:
    from hyper_parallel.viz.style import fmt_bytes
    mine = next((i for i, r in enumerate(ranked) if r.dims == dims), None)
    print(f"\n{len(ranked)} valid layouts of {dims.world_size} ranks, best first (within {memory_gib:g} GiB per rank "
          f"first, then by {'communication time' if sort == 'time' else 'memory'}):")
    rows = []
    for index, layout in enumerate(ranked[:top]):
        shown = ", ".join(f"{k}={v}" for k, v in layout.dims.degrees().items() if k != "world_size" and v != 1)
        rows.append((str(index + 1), shown or "-", fmt_bytes(layout.memory_bytes), f"{layout.comm_seconds * 1e3:.1f}",
                     "yes" if layout.fits else "no", "<- this plan" if index == mine else ""))
    _table(("#", "degrees", "memory/rank", "comm ms/step", "fits", ""), rows)
    if mine is not None and mine >= top:
        print(f"this plan's layout is #{mine + 1}")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    from launch.cli import print_table
    print_table(header, rows)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.world_size is None:
        raise ValueError("--world is required (the number of ranks)")
    degrees = {k: getattr(args, k) for k in ("world_size", "dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp")}
    dims = ParallelDims(**{k: v for k, v in degrees.items() if v is not None})
    config = model_from_args(args)
    bandwidth = Bandwidth(args.intra_node_gbs * 1e9, args.inter_node_gbs * 1e9)
    plan = make_plan(config, dims, args.gpus_per_node, args.rank, bandwidth)
    command = torchrun_command(config, dims, args.gpus_per_node, args.rdzv_endpoint)
    ranked = rank_layouts(config, dims.world_size, args.gpus_per_node, args.memory_gib, args.sort, bandwidth) \
        if args.compare else None
    if args.json:
        payload = {"plan": plan_json(plan, command)}
        if ranked is not None:
            payload["compare"] = [{"degrees": r.dims.degrees(), "memory_bytes": r.memory_bytes,
                                   "comm_seconds": r.comm_seconds, "fits": r.fits} for r in ranked[:args.top]]
            payload["compare_total"] = len(ranked)
        print(json.dumps(payload, indent=1))
        return 0
    print_plan(plan, command)
    if ranked is not None:
        print_compare(ranked, dims, args.top, args.memory_gib, args.sort)
    return 0
