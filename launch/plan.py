"""``python -m launch plan``: a layout of up to thousands of ranks, checked and costed in one process.

    python -m launch plan --world 4096 --dp-replicate 8 --dp-shard 16 --cp 2 --tp 16 --model llama-8b-like
    python -m launch plan --world 4096 --tp 8 --model llama-8b-like --gpus-per-node 8 --compare

Validates the degrees with ``ParallelDims`` and the model's shapes (the messages of ``launch check``;
exit status 2 when invalid), builds every DeviceMesh view on torch's fake process group (one process
plays rank ``--rank`` of the world, no worker starts), and prints each dim's group size, example rank
lists read from the DeviceMeshes, which groups cross node boundaries for ``--gpus-per-node``, the cost
model's per-rank memory and per-step communication (``hyper_parallel.cost_model``), and the multi-node
torchrun command. ``--compare`` ranks every valid layout of the same world size by step time (compute
and overlap: ``hyper_parallel.cost_model.step_time``) within the memory budget; ``--json`` prints all of
it as one JSON document.

    python -m launch plan --world 512 --model llama-8b-like --layouts "dp_shard=512; dp_shard=64,tp=8" \
        --format md --out review.html

``--layouts`` reviews named candidates side by side (``launch.report.design_review``: text, md, csv,
json; ``--out X.html`` writes the self-contained page, another suffix the ``--format`` text). Training
knobs (``--micro-batch``, ``--grad-accum``, ``--ac``, ``--loss-parallel``, ``--reshard-after-forward``,
``--expert-shard-dim``) and the machine (``--hardware`` preset, ``--peak-tflops``, ``--intra-node-gbs``,
``--inter-node-gbs``, ``--memory-gib``, ``--memory-reserve-gib``) apply to every view.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from hyper_parallel.cost_model import CLI_MODELS, PRECISIONS, CostEstimate, ModelConfig, estimate, get_model
from hyper_parallel.cost_model.hardware import DEFAULT_HARDWARE, HARDWARE, Hardware, get_hardware
from hyper_parallel.cost_model.layouts import GIB, Bandwidth, TimedCollective, check_gpus_per_node
from hyper_parallel.cost_model.model_configs import AC_MODES
from hyper_parallel.cost_model.ranking import RankedLayout, rank_layouts
from hyper_parallel.cost_model.review import RESOLUTION, parse_layouts, review_layouts, warnings_of
from hyper_parallel.cost_model.step_time import StepEstimate, estimate_step
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import DEGREE_NAMES, MeshDim
from hyper_parallel.recipes import registry

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
    parser.add_argument(
        "--hardware",
        choices=sorted(HARDWARE),
        default=DEFAULT_HARDWARE.name,
        help=f"machine preset (default: {DEFAULT_HARDWARE.name}); the flags below override it",
    )
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 TFLOPS per GPU")
    parser.add_argument("--intra-node-gbs", type=float, help="GB/s per rank inside a node")
    parser.add_argument("--inter-node-gbs", type=float, help="GB/s per rank across nodes")
    parser.add_argument("--memory-gib", type=float, help="memory per GPU (the preset's by default)")
    parser.add_argument(
        "--memory-reserve-gib",
        type=float,
        help="memory kept free of the model: CUDA context, NCCL buffers, fragmentation (default 8)",
    )
    parser.add_argument("--micro-batch", type=int, help="rows per rank per forward (grad-accum derived)")
    parser.add_argument("--grad-accum", type=int, help="micro-batches per step (micro-batch derived)")
    parser.add_argument("--ac", choices=AC_MODES, default="none", help="activation checkpointing (default: none)")
    parser.add_argument("--loss-parallel", action="store_true", help="TP keeps the logits sharded for the loss")
    parser.add_argument(
        "--reshard-after-forward",
        choices=("true", "false"),
        default="true",
        help="false: keep gathered parameters from forward to backward (default: true)",
    )
    parser.add_argument(
        "--expert-shard-dim",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="axis of the expert tensors [E, d, h] FSDP shards (default: 0, the experts)",
    )
    parser.add_argument(
        "--layouts", help='named candidates side by side, e.g. "dp_shard=512; dp_replicate=64,dp_shard=8"'
    )
    parser.add_argument(
        "--format", choices=("text", "md", "csv", "json"), default="text", help="--layouts output (default: text)"
    )
    parser.add_argument("--out", help="--layouts: write the review here (.html: the self-contained page)")
    parser.add_argument("--rdzv-endpoint", default="$MASTER_ADDR:29500")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")


@dataclass(frozen=True)
class Plan:
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


def model_from_args(args: argparse.Namespace) -> ModelConfig:
    config = get_model(args.model)
    changes = {
        "seq_len": args.seq_len,
        "global_batch": args.batch,
        "precision": PRECISIONS[args.precision] if args.precision else None,
        "micro_batch": args.micro_batch,
        "grad_accum": args.grad_accum,
        "activation_checkpointing": args.ac,
        "loss_parallel": args.loss_parallel or None,
        "reshard_after_forward": args.reshard_after_forward == "true",
        "expert_shard_dim": args.expert_shard_dim,
    }
    return config.replace(**{k: v for k, v in changes.items() if v is not None})


def hardware_from_args(args: argparse.Namespace) -> Hardware:
    """The preset with the flags given on the command line replacing its numbers."""
    return get_hardware(args.hardware).replace(
        peak_tflops=args.peak_tflops,
        intra_node_gbs=args.intra_node_gbs,
        inter_node_gbs=args.inter_node_gbs,
        memory_gib=args.memory_gib,
        reserve_gib=args.memory_reserve_gib,
    )


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
    from launch.text_table import multinode_command

    nnodes, per_node = max(1, dims.world_size // gpus_per_node), min(gpus_per_node, dims.world_size)
    explicit = json.dumps({k: v for k, v in dims.degrees().items() if k != "world_size"})
    recipe = _recipe_training(config, dims)
    if recipe is not None:
        worker = [
            "-m",
            "hyper_parallel.recipes.worker",
            "--recipe",
            recipe,
            "--degrees",
            explicit,
            "--steps",
            str(registry.get(recipe).steps),
        ]
        return multinode_command(nnodes, per_node, rdzv_endpoint, worker)
    return (
        "# no workbook recipe trains this model on these degrees: the same launch for your own trainer, which\n"
        "# builds its meshes with build_mesh(ParallelDims(**degrees))\n"
        + multinode_command(nnodes, per_node, rdzv_endpoint, ["-m", "your_training_module", "--degrees", explicit])
    )


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
        "degrees": plan.dims.degrees(),
        "model": cost.config.name,
        "parameters": cost.parameter_count,
        "seq_len": cost.config.seq_len,
        "global_batch": cost.config.global_batch,
        "precision": cost.config.precision.name,
        "gpus_per_node": plan.gpus_per_node,
        "rank": plan.rank,
        "groups": plan.groups,
        "memory": cost.memory.as_dict(),
        "communication": [c.__dict__ for c in plan.collectives],
        "comm_seconds": plan.comm_seconds,
        "step": _step_json(plan.step),
        "hardware": plan.hardware.name,
        "memory_budget_bytes": plan.hardware.budget_bytes,
        "fits": cost.memory.total <= plan.hardware.budget_bytes,
        "warnings": warnings_of(cost, plan.hardware, plan.gpus_per_node),
        "assumptions": assumptions(plan.cost.config, plan.bandwidth, plan.hardware),
        "command": command,
    }


def _step_json(step: StepEstimate) -> dict:
    return {
        "flops_per_rank": step.flops.total,
        "model_flops_per_rank": step.flops.model,
        "recompute_flops_per_rank": step.flops.recompute,
        "seconds": step.seconds,
        "seconds_range": [step.fast.total, step.slow.total],
        "mfu": step.middle.mfu,
        "compute_seconds": step.middle.compute,
        "critical_seconds": step.middle.critical,
        "exposed_seconds": step.middle.exposed,
        "hidden_seconds": step.middle.hidden,
        "inter_node_bytes": step.inter_node_bytes,
    }


def assumptions(config: ModelConfig, bandwidth: Bandwidth, hardware: Hardware = DEFAULT_HARDWARE) -> list[str]:
    p = config.precision
    return [
        f"precision {p.name}: sharded parameters and gradients {p.storage} B/element, all-gathers and "
        f"activations {p.compute} B, gradient reduction {p.reduce} B, optimizer state {p.optimizer_state} B "
        f"per parameter element",
        f"memory: sharded state exact (padding included); activations estimated (activation checkpointing "
        f"{config.activation_checkpointing}, fused attention, one micro-batch resident); see "
        f"hyper_parallel.cost_model.memory",
        "communication: bytes per collective as traced (full buffers); EP rows assume balanced routing",
        "time per collective: " + bandwidth.describe(),
        "step: FLOPs per matmul (6 N + 12 L s d per token, recomputation added; cost_model.compute) at the "
        "efficiency range of " + hardware.describe() + "; FSDP/HSDP collectives overlap compute (prefetch, "
        "async reduce-scatter), TP/CP/EP ones are on the critical path (cost_model.step_time)",
    ]


def print_plan(plan: Plan, command: str) -> None:
    from hyper_parallel.viz.style import fmt_bytes

    cost, dims = plan.cost, plan.dims
    nodes, per_node = max(1, dims.world_size // plan.gpus_per_node), min(plan.gpus_per_node, dims.world_size)
    print(f"plan: {cost.config.name} on {dims.world_size} ranks ({nodes} node(s) x {per_node})")
    print(f"  {cost.config.describe()}; {cost.parameter_count:.3g} parameters")
    print("valid: " + dims.describe())
    print(f"\ngroups (read from DeviceMeshes on a fake process group; rank {plan.rank}'s group and the first group):")
    rows = [
        (
            dim,
            str(g["size"]),
            str(g["count"]),
            f"{g['nodes_spanned']}" + (" (crosses)" if g["nodes_spanned"] > 1 else ""),
            _ranks(g["rank_group"]),
            _ranks(g["first_groups"][0]),
        )
        for dim, g in plan.groups.items()
    ]
    _table(("dim", "size", "groups", "nodes/group", f"rank {plan.rank}'s group", "first group"), rows)
    crossing = [dim for dim, g in plan.groups.items() if g["nodes_spanned"] > 1]
    print(f"groups crossing node boundaries with {plan.gpus_per_node} GPUs per node: {', '.join(crossing) or 'none'}")
    budget = plan.hardware.budget_bytes
    print(
        "\nmemory per rank: "
        + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in cost.memory.as_dict().items())
        + f" ({'within' if cost.memory.total <= budget else 'OVER'} the {budget / GIB:.1f} GiB budget)"
    )
    print("\ncommunication of one step on every rank:")
    rows = [
        (
            c.op,
            c.group,
            c.phase,
            str(c.count),
            fmt_bytes(c.bytes),
            fmt_bytes(c.wire_bytes),
            "yes" if c.crosses_nodes else "no",
            f"{c.seconds * 1e3:.2f}",
        )
        for c in plan.collectives
    ]
    _table(("op", "group", "phase", "calls", "bytes", "wire bytes", "crosses", "ms"), rows)
    print(f"total: {plan.comm_seconds * 1e3:.1f} ms per step if nothing overlapped")
    step = plan.step
    print(
        f"\nstep: {step.flops.total / 1e12:.0f} TFLOP per rank ({step.flops.recompute / 1e12:.0f} recomputed), "
        f"{step.seconds:.2f} s ({step.fast.total:.2f}-{step.slow.total:.2f}), MFU {step.middle.mfu:.0%}: compute "
        f"{step.middle.compute:.2f} s, critical comm {step.middle.critical:.2f} s, exposed FSDP/HSDP "
        f"{step.middle.exposed:.2f} s, hidden {step.middle.hidden:.2f} s; {step.inter_node_bytes / GIB:.1f} GiB "
        f"per rank cross nodes"
    )
    if dims.pp > 1:
        from hyper_parallel.cost_model.pipeline import plan_lines

        print("\n" + "\n".join(plan_lines(cost.config, dims)))
    for warning in warnings_of(cost, plan.hardware, plan.gpus_per_node):
        print(f"WARNING: {warning}")
    print(
        "\nassumptions:\n"
        + "\n".join(f"  - {line}" for line in assumptions(cost.config, plan.bandwidth, plan.hardware))
    )
    print(f"\nmulti-node command (run on every node):\n{command}")


def ranks_with_ties(values: list[float]) -> list[str]:
    """Places of values sorted best first: a value within RESOLUTION of its group's first shares its place
    ("2=")."""
    places, leader, tied = [], 0, set()
    for index, value in enumerate(values):
        if index and value <= values[leader] * (1 + RESOLUTION):
            tied.update((leader, index))
        else:
            leader = index
        places.append(leader)
    return [f"{p + 1}=" if p in tied else str(p + 1) for p in places]


def fmt_seconds(seconds: float) -> str:
    """'1.41 s', '12.3 ms', '45.6 us': the recipes' tiny models step in microseconds, llama-8b in seconds."""
    if seconds >= 0.1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.3g} us"


def print_compare(ranked: list[RankedLayout], dims: ParallelDims, top: int, budget_bytes: float, sort: str) -> None:
    from hyper_parallel.viz.style import fmt_bytes

    mine = next((i for i, r in enumerate(ranked) if r.dims == dims), None)
    print(
        f"\n{len(ranked)} valid layouts of {dims.world_size} ranks, best first (within {budget_bytes / GIB:.1f} GiB "
        f"per rank first, then by {'step time' if sort == 'time' else 'memory'}; step times within "
        f"{RESOLUTION:.0%} share a place, '='):"
    )
    fitting = [r.step_seconds for r in ranked if r.fits] if sort == "time" else []
    places = (
        ranks_with_ties(fitting) + [str(i + 1) for i in range(len(fitting), len(ranked))]
        if fitting
        else [str(i + 1) for i in range(len(ranked))]
    )
    rows = []
    for index, layout in enumerate(ranked[:top]):
        shown = ", ".join(f"{k}={v}" for k, v in layout.dims.degrees().items() if k != "world_size" and v != 1)
        low, high = layout.step_range
        rows.append(
            (
                places[index],
                shown or "-",
                fmt_bytes(layout.memory_bytes),
                f"{fmt_seconds(layout.step_seconds)} ({fmt_seconds(low)}-{fmt_seconds(high)})",
                f"{layout.mfu:.0%}",
                f"{layout.exposed_seconds * 1e3:.0f}",
                f"{layout.comm_seconds * 1e3:.1f}",
                "yes" if layout.fits else "no",
                "<- this plan" if index == mine else "",
            )
        )
    _table(
        ("#", "degrees", "memory/rank", "step (range)", "MFU", "exposed comm ms", "comm ms if serial", "fits", ""), rows
    )
    if mine is not None and mine >= top:
        print(f"this plan's layout is #{mine + 1}")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    from launch.text_table import print_table

    print_table(header, rows)


def cmd_review(args: argparse.Namespace, config: ModelConfig, hardware: Hardware) -> int:
    """``--layouts``: the named candidates side by side, printed in ``--format`` and written to ``--out``."""
    from launch.report.design_review import render, to_html

    check_gpus_per_node(args.world_size, args.gpus_per_node)
    reviews = review_layouts(config, parse_layouts(args.layouts, args.world_size), args.gpus_per_node, hardware)
    fmt = "json" if args.json else args.format
    text = render(fmt, reviews, config, hardware, args.world_size, args.gpus_per_node)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix.lower() in (".html", ".htm"):
            command = "python -m launch plan " + " ".join(_quoted(a) for a in getattr(args, "argv", []))
            out.write_text(
                to_html(reviews, config, hardware, args.world_size, args.gpus_per_node, command), encoding="utf-8"
            )
        else:
            out.write_text(text + "\n", encoding="utf-8")
        print(f"review: {out}", file=sys.stderr)  # stdout stays one parseable document
    return 0


def _quoted(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.world_size is None:
        raise ValueError("--world is required (the number of ranks)")
    config = model_from_args(args)
    hardware = hardware_from_args(args)
    if args.layouts is not None:
        return cmd_review(args, config, hardware)
    if args.out:
        raise ValueError('--out writes a --layouts review; give --layouts "CANDIDATE; CANDIDATE"')
    degrees = {k: getattr(args, k) for k in ("world_size", *DEGREE_NAMES)}
    dims = ParallelDims(**{k: v for k, v in degrees.items() if v is not None})
    plan = make_plan(config, dims, args.gpus_per_node, args.rank, hardware)
    command = torchrun_command(config, dims, args.gpus_per_node, args.rdzv_endpoint)
    ranked = rank_layouts(config, dims.world_size, args.gpus_per_node, hardware, args.sort) if args.compare else None
    if args.json or args.format == "json":
        payload = {"plan": plan_json(plan, command)}
        if ranked is not None:
            payload["compare"] = [
                {
                    "degrees": r.dims.degrees(),
                    "memory_bytes": r.memory_bytes,
                    "comm_seconds": r.comm_seconds,
                    "step_seconds": r.step_seconds,
                    "step_range": list(r.step_range),
                    "mfu": r.mfu,
                    "exposed_seconds": r.exposed_seconds,
                    "fits": r.fits,
                }
                for r in ranked[: args.top]
            ]
            payload["compare_total"] = len(ranked)
        print(json.dumps(payload, indent=1))
        return 0
    print_plan(plan, command)
    if ranked is not None:
        print_compare(ranked, dims, args.top, hardware.budget_bytes, args.sort)
    return 0
