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

``--layouts`` reviews named candidates side by side (``launch.plan.review_page``: text, md, csv,
json; ``--out X.html`` writes the self-contained page, another suffix the ``--format`` text). Training
knobs (``--micro-batch``, ``--grad-accum``, ``--ac``, ``--loss-parallel``, ``--reshard-after-forward``,
``--expert-shard-dim``, ``--pp-schedule``, ``--virtual-stages``) and the machine (``--hardware`` preset, ``--peak-tflops``, ``--intra-node-gbs``,
``--inter-node-gbs``, ``--memory-gib``, ``--memory-reserve-gib``) apply to every view.

``--model-config config.json`` plans your own model from its Hugging Face config (``cost_model.hf_config``).
Bad input (sizes <= 0, --top < 1, a degree that does not divide the world, pp that does not split the
layers, NaN machine numbers, a degree named twice in --layouts) is refused with the rule and the
nearest valid value: the checks live in the cost model (``cost_model.validation``, ``ModelConfig``,
``Hardware``), and ``launch.cli`` maps their ``ValueError`` to exit status 2.

This module is the command line (flags, what runs for which of them); ``launch.plan.build`` builds a
plan (mesh groups, cost, torchrun command) and ``launch.plan.render`` prints it.
"""

from __future__ import annotations

import argparse
import json
import sys

from hyper_parallel.cost_model import CLI_MODELS, PRECISIONS, ModelConfig, get_model, load_model_config
from hyper_parallel.cost_model.hardware import DEFAULT_HARDWARE, HARDWARE, Hardware, get_hardware
from hyper_parallel.cost_model.layouts import check_gpus_per_node
from hyper_parallel.cost_model.model_configs import AC_MODES
from hyper_parallel.cost_model.pipeline import SCHEDULES, edge_stages, get_schedule
from hyper_parallel.cost_model.ranking import rank_layouts
from hyper_parallel.cost_model.review import parse_layouts, review_layouts
from hyper_parallel.cost_model.stacks import STACKS
from hyper_parallel.cost_model.validation import check_degrees_divide, check_step_sizes
from hyper_parallel.mesh import ParallelDims, check_world_size
from hyper_parallel.mesh_dims import DEGREE_NAMES
from hyper_parallel.recipes.workload_facts import SequenceScheme
from hyper_parallel.run_files import NO_SPACE, write_atomic
from launch import inputs
from launch.plan.build import make_plan, torchrun_command
from launch.plan.render import compare_json, plan_json, print_compare, print_plan
from launch.plan.review_page import FORMATS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan subcommand's own flags (the degrees come from ``launch.cli``), one help section per concern."""
    for add_flags in (
        _add_model_flags,
        _add_pipeline_flags,
        _add_training_flags,
        _add_machine_flags,
        _add_output_flags,
    ):
        add_flags(parser)


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "model", "the model and its step: a preset or a config file, the sizes that override it"
    )
    group.add_argument("--model", default="small", choices=CLI_MODELS, help="model preset (default: small)")
    group.add_argument(
        "--model-config",
        metavar="PATH",
        help="a Hugging Face config.json (Llama, Mistral, Qwen2, Mixtral, Qwen2-MoE, DeepSeekMoE, GPT-2) instead of --model",
    )
    group.add_argument("--seq-len", type=int, help="override the preset's sequence length")
    group.add_argument("--batch", type=int, help="override the preset's global batch (sequences per step)")
    group.add_argument("--precision", choices=sorted(PRECISIONS), help="override the preset's precision")
    group.add_argument(
        "--stack", choices=sorted(STACKS), help="the training stack's habits (default: the preset's, torchtitan)"
    )


def _add_pipeline_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("pipeline", "with --pp > 1: the schedule and how the layers fall on the stages")
    group.add_argument(
        "--pp-schedule",
        choices=sorted({*SCHEDULES, *(name.replace("_", "-") for name in SCHEDULES)}),
        default="1f1b",
        help="pipeline schedule with --pp > 1, torch.distributed.pipelining's: gpipe, 1f1b, interleaved-1f1b, "
        "interleaved-zb, zbv, dualpipev (default: 1f1b)",
    )
    group.add_argument(
        "--virtual-stages",
        type=int,
        help="stages per pp rank (default 2 for the interleaved, zbv and dualpipev schedules, else 1)",
    )
    group.add_argument(
        "--stage-layers",
        help='layers of every pipeline stage in order, e.g. "7,8,8,...,7" (pp x virtual-stages of them; 0 allowed '
        "for a stage that holds only the embedding or the head)",
    )
    group.add_argument(
        "--first-stage-layers",
        type=int,
        help="layers of the first pipeline stage, the rest split evenly (Megatron's --decoder-first-pipeline-num-layers)",
    )
    group.add_argument(
        "--last-stage-layers",
        type=int,
        help="layers of the last pipeline stage, the rest split evenly (Megatron's --decoder-last-pipeline-num-layers)",
    )


def _add_training_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "training", "how each rank trains: what is sharded, kept, recomputed and overlapped"
    )
    group.add_argument(
        "--zero",
        type=int,
        choices=(1, 2, 3),
        help="ZeRO stage over dp_shard: 3 shards the parameters (FSDP, default), 2 gradients and optimizer "
        "state, 1 the optimizer state; --compare ranks the layouts under it",
    )
    group.add_argument(
        "--float8", action="store_true", help="tensorwise float8 linears (matmuls at the fp8 peak, float8 all-gathers)"
    )
    group.add_argument("--async-tp", action="store_true", help="TP collectives overlapped with the matmuls")
    group.add_argument(
        "--sequence-scheme",
        choices=[s.value for s in SequenceScheme],
        help="how cp > 1 attends over the sequence: K/V all_gather (default), ring (sends overlapped with the "
        "attention) or ulysses (all-to-all to heads)",
    )
    group.add_argument("--micro-batch", type=int, help="rows per rank per forward (grad-accum derived)")
    group.add_argument("--grad-accum", type=int, help="micro-batches per step (micro-batch derived)")
    group.add_argument("--ac", choices=AC_MODES, default="none", help="activation checkpointing (default: none)")
    group.add_argument("--loss-parallel", action="store_true", help="TP keeps the logits sharded for the loss")
    group.add_argument(
        "--reshard-after-forward",
        choices=("true", "false"),
        default="true",
        help="false: keep gathered parameters from forward to backward (default: true)",
    )
    group.add_argument(
        "--expert-shard-dim",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="axis of the expert tensors [E, d, h] FSDP shards (default: 0, the experts)",
    )


def _add_machine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("machine", "the hardware preset and the figures that override it")
    group.add_argument(
        "--hardware",
        choices=sorted(HARDWARE),
        default=DEFAULT_HARDWARE.name,
        help=f"machine preset (default: {DEFAULT_HARDWARE.name}); the flags below override it",
    )
    group.add_argument("--peak-tflops", type=float, help="dense bf16 TFLOPS per GPU")
    group.add_argument("--intra-node-gbs", type=float, help="GB/s per rank inside a node")
    group.add_argument("--inter-node-gbs", type=float, help="GB/s per rank across nodes")
    group.add_argument("--memory-gib", type=float, help="memory per GPU (the preset's by default)")
    group.add_argument(
        "--memory-reserve-gib",
        type=float,
        help="memory kept free of the model: CUDA context, NCCL buffers (default 1)",
    )
    group.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default: 8)")


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output", "what is shown: one layout's groups, a ranking, named candidates, JSON")
    group.add_argument("--rank", type=int, default=0, help="the rank whose groups are shown (default: 0)")
    group.add_argument("--compare", action="store_true", help="rank every valid layout of this world size")
    group.add_argument("--sort", choices=("time", "memory"), default="time", help="--compare order (default: time)")
    group.add_argument("--top", type=int, default=10, help="--compare: layouts shown (default: 10)")
    group.add_argument(
        "--choose",
        action="store_true",
        help="--compare: each layout runs the fastest sequence scheme (cp > 1) and pipeline schedule (pp > 1)",
    )
    group.add_argument(
        "--layouts", help='named candidates side by side, e.g. "dp_shard=512; dp_replicate=64,dp_shard=8"'
    )
    group.add_argument("--format", choices=FORMATS, default="text", help="--layouts output (default: text)")
    group.add_argument("--out", help="--layouts: write the review here (.html: the self-contained page)")
    group.add_argument("--rdzv-endpoint", default="$MASTER_ADDR:29500")
    group.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def model_from_args(args: argparse.Namespace, layouts: list[ParallelDims] = ()) -> ModelConfig:
    """The preset (or ``--model-config`` file) with the flags' changes; the step's sizes are checked against
    ``layouts`` first, so a bad one is refused with the smallest size all of them accept."""
    check_step_sizes(args.seq_len, args.batch, list(layouts))
    config = load_model_config(args.model_config) if args.model_config else get_model(args.model)
    schedule = args.pp_schedule.replace("-", "_")
    if args.virtual_stages is not None and args.virtual_stages < 1:
        raise ValueError(f"--virtual-stages must be >= 1 (stages per pp rank), got {args.virtual_stages}")
    virtual = args.virtual_stages or get_schedule(schedule).default_stages_per_rank
    changes = {
        "pp_schedule": schedule,
        "virtual_stages": virtual,
        "stage_layers": _stage_layers(args, config, virtual, layouts),
        "zero": args.zero,
        "float8": args.float8 or None,
        "async_tp": args.async_tp or None,
        "sequence_scheme": args.sequence_scheme,
        "stack": args.stack,
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


def _stage_layers(args: argparse.Namespace, config: ModelConfig, virtual: int, layouts) -> tuple[int, ...] | None:
    """``--stage-layers`` as given, or the first/last stage's layers with the middle ones split evenly."""
    if args.stage_layers is not None:
        try:
            return tuple(int(x) for x in args.stage_layers.replace(" ", "").split(","))
        except ValueError:
            raise ValueError(
                f'--stage-layers {args.stage_layers!r}: give integers separated by commas, e.g. "7,8,8,7"'
            ) from None
    if args.first_stage_layers is None and args.last_stage_layers is None:
        return None
    pps = {dims.pp for dims in layouts}
    if len(pps) != 1 or pps == {1}:
        raise ValueError("--first-stage-layers / --last-stage-layers need one --pp > 1 to split the layers over")
    stages = pps.pop() * virtual
    rest = config.n_layers - (args.first_stage_layers or 0) - (args.last_stage_layers or 0)
    middle = stages - (args.first_stage_layers is not None) - (args.last_stage_layers is not None)
    even = rest // max(middle, 1)
    first = args.first_stage_layers if args.first_stage_layers is not None else even
    last = args.last_stage_layers if args.last_stage_layers is not None else even
    return edge_stages(stages // virtual, virtual, first, last, config.n_layers)


def hardware_from_args(args: argparse.Namespace) -> Hardware:
    """The preset with the flags given on the command line replacing its numbers."""
    return get_hardware(args.hardware).replace(
        peak_tflops=args.peak_tflops,
        intra_node_gbs=args.intra_node_gbs,
        inter_node_gbs=args.inter_node_gbs,
        memory_gib=args.memory_gib,
        reserve_gib=args.memory_reserve_gib,
    )


def cmd_review(args: argparse.Namespace, config: ModelConfig, hardware: Hardware, layouts: list[ParallelDims]) -> int:
    """``--layouts``: the named candidates side by side, printed in ``--format`` and written to ``--out``."""
    from launch.plan.review_page import render, to_html

    check_gpus_per_node(args.world_size, args.gpus_per_node)
    reviews = review_layouts(config, layouts, args.gpus_per_node, hardware)
    fmt = "json" if args.json else args.format
    text = render(fmt, reviews, config, hardware, args.world_size, args.gpus_per_node)
    print(text)
    if args.out:
        out = inputs.out_file(args.out)
        if out.suffix.lower() in (".html", ".htm"):
            command = "python -m launch plan " + " ".join(_quoted(a) for a in getattr(args, "argv", []))
            page = to_html(reviews, config, hardware, args.world_size, args.gpus_per_node, command)
        else:
            page = text + "\n"
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(out, page)
        except OSError as error:
            if error.errno in NO_SPACE:
                raise
            raise ValueError(f"--out {out}: cannot write the review ({error.strerror})") from None
        print(f"review: {out}", file=sys.stderr)  # stdout stays one parseable document
    return 0


def _quoted(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.world_size is None:
        raise ValueError("--world is required (the number of ranks)")
    check_world_size(args.world_size, "--world")
    if args.top < 1:
        raise ValueError(f"--top (layouts shown by --compare) must be >= 1, got {args.top}; nearest valid --top: 1")
    hardware = hardware_from_args(args)
    if args.layouts is not None:
        layouts = parse_layouts(args.layouts, args.world_size)
        return cmd_review(args, model_from_args(args, layouts), hardware, layouts)
    if args.out:
        raise ValueError('--out writes a --layouts review; give --layouts "CANDIDATE; CANDIDATE"')
    degrees = {k: getattr(args, k) for k in ("world_size", *DEGREE_NAMES)}
    check_degrees_divide(args.world_size, degrees)
    dims = ParallelDims(**{k: v for k, v in degrees.items() if v is not None})
    if not 0 <= args.rank < dims.world_size:  # before torch is imported to build the groups
        raise ValueError(f"--rank {args.rank} is outside world_size={dims.world_size}; give 0 .. {dims.world_size - 1}")
    config = model_from_args(args, [dims])
    try:
        plan = make_plan(config, dims, args.gpus_per_node, args.rank, hardware)
    except ValueError as error:
        if not args.compare:
            raise
        plan, refused = None, f"the layout given ({dims.label()}) is not one: {error}"
    if args.choose and not args.compare:
        raise ValueError("--choose picks each layout's sequence scheme and schedule in --compare: add --compare")
    ranked = (
        rank_layouts(config, dims.world_size, args.gpus_per_node, hardware, args.sort, choose=args.choose)
        if args.compare
        else None
    )
    command = torchrun_command(config, dims, args.gpus_per_node, args.rdzv_endpoint) if plan else None
    if args.json or args.format == "json":
        payload = {"plan": plan_json(plan, command) if plan else None}
        if plan is None:
            payload["refused"] = refused
        if ranked is not None:
            payload["compare"] = compare_json(ranked, args.top)
            payload["compare_total"] = len(ranked)
        print(json.dumps(payload, indent=1))
        return 0
    if plan is not None:
        print_plan(plan, command)
    else:
        print(f"{refused}\n--compare ranks the layouts that are:")
    if ranked is not None:
        print_compare(ranked, dims, args.top, hardware.budget_bytes, args.sort)
    return 0
