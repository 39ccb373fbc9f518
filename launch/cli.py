"""``python -m launch``: list recipes, check degrees, run a recipe, print a multi-node command.

    python -m launch list
    python -m launch check --world 8 --tp 2 --cp 2
    python -m launch run M4 --dp-shard 2 --steps 3 --out runs/m4
    python -m launch command M6 --nnodes 2 --nproc-per-node 8 --rdzv-endpoint host0:29500
    python -m launch plan --world 4096 --tp 8 --model llama-8b-like --gpus-per-node 8 --compare
    python -m launch workbook --out runs
    python -m launch bench --world 4 --steps 20 --out runs/bench
    python -m launch report runs/m4 --out m4.html
    python -m launch report --compare runs/m4 runs/m7 --out compare.html

Invalid input exits with status 2 and the rule's message before any worker starts (``launch.inputs``);
a run that does not match its reference exits with 1; a full disk with 4 ("no space left in <folder>"). ``run`` always starts a fresh torchrun launch (a
one-shot command gains nothing from the warm pool, which serves notebooks: docs/warm_pool.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import DEGREE_KEYS, DEGREE_NAMES
from hyper_parallel.recipes import registry
from hyper_parallel.recipes.options import OPTION_NAMES
from hyper_parallel.run_files import NO_SPACE, NoSpaceError, no_space
from launch import inputs
from launch.bench import flags as bench_flags
from launch.plan.multinode import multinode_command, new_rdzv_id
from launch.processes.run_dirs import RunDirError
from launch.tables import print_table

EXIT_INVALID = 2
EXIT_NO_SPACE = 4


_Once = inputs.Once


def _add_degrees(parser: argparse.ArgumentParser, world_flag: str = "--world") -> None:
    parser.add_argument(world_flag, dest="world_size", type=int, action=_Once, help="number of ranks")
    for name in DEGREE_NAMES:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=int, action=_Once)


def _degrees(args: argparse.Namespace) -> dict[str, int | None]:
    return {name: getattr(args, name) for name in DEGREE_KEYS}


def _add_options(parser: argparse.ArgumentParser) -> None:
    """The recipe's options (hyper_parallel/recipes/options.py): left out, each is the recipe's default
    or, when that does not fit the mesh, the nearest value that does."""
    helps = {
        "global_batch": "samples per optimizer step, over all data-parallel ranks",
        "seq_len": "tokens per sample (transformer recipes)",
        "num_experts": "experts of each MoE layer (MoE recipes)",
        "microbatches": "microbatches per data-parallel rank and step (pipeline recipes)",
    }
    for name in OPTION_NAMES:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=int, action=_Once, help=helps[name])


def _options(args: argparse.Namespace) -> dict[str, int | None]:
    return {name: getattr(args, name, None) for name in OPTION_NAMES}


def cmd_list() -> int:
    rows = []
    for recipe in registry.RECIPES.values():
        dims = ParallelDims(**recipe.default)
        meshes = 1 + len(recipe.alternatives)
        status = f"checked on {meshes} mesh{'es' if meshes > 1 else ''}"
        rows.append(
            (
                recipe.name,
                recipe.tier or "-",
                f"{dims.world_size}: {dims.label(sep=' x ')}",
                recipe.constraints() or "-",
                status,
                recipe.title,
            )
        )
    rows += [
        (name, "-", "-", "-", "not runnable here", reason.split(". ")[0])
        for name, reason in registry.NOT_RUNNABLE.items()
    ]
    print_table(("recipe", "tier", "ranks: default dims", "constraints", "status", "title"), rows)
    print("\nstatus: runs of tests/test_recipes.py against the single-process reference (python -m launch run RECIPE)")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from launch.runs import resolve_run

    options = None
    if args.recipe:
        spec = resolve_run(args.recipe, **_degrees(args), **_options(args))
        dims, options = spec.dims, spec.options
    else:
        if args.world_size is None:
            raise ValueError("--world is required (the number of ranks)")
        if any(value is not None for value in _options(args).values()):
            raise ValueError("--global-batch, --seq-len, --num-experts and --microbatches need --recipe")
        dims = ParallelDims(**{k: v for k, v in _degrees(args).items() if v is not None})
    print("valid: " + dims.describe())
    if options is not None:
        _print_options(options)
    print("example groups (global ranks):")
    seen = set()
    for view in dims.views().values():
        for name, size in view:
            if size > 1 and name not in seen:
                seen.add(name)
                groups = dims.group_ranks(name)
                more = f" ... ({len(groups)} groups)" if len(groups) > 2 else ""
                print(f"  {name:<13} size {size:<4} {groups[:2]}{more}")
    return 0


def _print_options(options) -> None:
    print("options: " + (", ".join(f"{k}={v}" for k, v in options.values().items()) or "none"))
    for note in options.notes():
        print(f"  {note}")


def _progress_bar(progress: dict) -> None:
    done, total = progress["step"], progress["steps"]
    bar = "#" * round(20 * done / total)
    print(
        f"  step {done}/{total} [{bar:<20}] loss {progress['loss']:.6f}  reference {progress['reference']:.6f}",
        flush=True,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from launch.runs import resolve_run, run_spec

    spec = resolve_run(
        args.recipe, steps=args.steps, seed=args.seed, out=args.out, link=args.link, **_degrees(args), **_options(args)
    )
    timeout = inputs.timeout(args.timeout, "--timeout")
    recipe = registry.get(spec.recipe)
    print(f"{recipe.name}: {recipe.title}\n  {spec.dims.describe()}", flush=True)
    _print_options(spec.options)
    if spec.link is not None:
        print(f"  {spec.link.describe()} (every collective waits latency + wire bytes / rate; numbers unchanged)")

    def show(rank: int, line: str) -> None:
        if not line.startswith("[progress]"):
            print(f"[rank{rank}] {line}" if rank >= 0 else line, flush=True)

    result = run_spec(
        spec, timeout=timeout, on_line=None if args.quiet else show, on_progress=_progress_bar, pool=False
    )
    summary = result.summary()
    print(
        f"{'OK' if result.ok else 'FAILED'}: {recipe.name} in {summary['duration']:.1f}s, "
        f"max |loss - reference| = {summary['max_abs_diff']}, max |param - reference| = {summary['max_param_diff']}"
    )
    if result.error:
        print(result.error, file=sys.stderr)
    if result.out_of_space:
        return EXIT_NO_SPACE
    if result.traces and not args.no_figures:
        from hyper_parallel.viz import run_figures

        figures = dict(run_figures(result.run_dir, out_dir=result.run_dir, svg=True))  # draws and saves each
        print(f"figures: {', '.join(f'{name}.png/.svg' for name in figures)}")
    if result.traces and args.chrome_trace:
        from hyper_parallel.run_files import CHROME_TRACE_FILE, to_chrome_trace

        print(f"chrome trace: {to_chrome_trace(result.traces, result.run_dir / CHROME_TRACE_FILE)}")
    print(f"run directory: {result.run_dir}")
    return 0 if result.ok else 1


_HOST = re.compile(r"\$[A-Za-z_]\w*|\$\{[A-Za-z_]\w*\}|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+")
"""A host name, an IPv4 or bracketed IPv6 address, or one shell variable (``$MASTER_ADDR``): nothing else the
printed command's shell would run or split (``$(touch x)``, `` `id` ``, ``a b;c``)."""


def _endpoint(value: str) -> str:
    """HOST:PORT (``$MASTER_ADDR:29500`` may stay a shell variable the nodes expand)."""
    host, _, port = value.rpartition(":")
    if not host or not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"--rdzv-endpoint must be HOST:PORT with a port in 1..65535, got {value!r}")
    if not _HOST.fullmatch(host):
        raise ValueError(
            f"--rdzv-endpoint HOST must be a host name, an address or one shell variable such as $MASTER_ADDR, "
            f"got {host!r} (the command is printed for a shell to run)"
        )
    return value


def cmd_command(args: argparse.Namespace) -> int:
    from launch.runs import resolve_run

    nnodes = inputs.positive_int(args.nnodes, "--nnodes")
    per_node = inputs.positive_int(args.nproc_per_node, "--nproc-per-node")
    spec = resolve_run(args.recipe, steps=args.steps, **_degrees(args), **_options(args))
    if nnodes * per_node != spec.dims.world_size:
        raise ValueError(
            f"--nnodes {nnodes} x --nproc-per-node {per_node} = {nnodes * per_node} != "
            f"world_size={spec.dims.world_size}"
        )
    rdzv_id = new_rdzv_id()
    # a path on the nodes, not checked here
    spec = dataclasses.replace(
        spec, out=Path(args.out or f"runs/{spec.recipe}-{rdzv_id.removeprefix('hyper-parallel-')}")
    )
    print(multinode_command(nnodes, per_node, _endpoint(args.rdzv_endpoint), spec.worker_args(), rdzv_id))
    print(
        f"# rank 0's node gets {spec.out}/metrics.json; every node its ranks' traces; exit status non-zero when the "
        f"run does not match its reference",
        file=sys.stderr,
    )
    return 0


def cmd_workbook(args: argparse.Namespace) -> int:
    from launch.notebook.workbook import run_workbook

    return run_workbook(args.out, jobs=args.jobs)


def cmd_report(args: argparse.Namespace) -> int:
    from launch.report import write_report

    if args.compare:
        if args.run_dir:
            raise ValueError("give either RUN_DIR or --compare RUN_A RUN_B, not both")
        from launch.report.compare import write_comparison

        print(f"comparison: {write_comparison(*args.compare, args.out)}")
        return 0
    if not args.run_dir:
        raise ValueError("give a run directory (python -m launch report RUN_DIR) or --compare RUN_A RUN_B")
    print(f"report: {write_report(args.run_dir, args.out)}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from launch.plan.flags import cmd_plan as plan

    return plan(args)


def _add_check(parser: argparse.ArgumentParser) -> None:
    _add_degrees(parser)
    parser.add_argument("--recipe", help="also check the recipe's constraints and shapes")
    _add_options(parser)


def _add_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe")
    _add_degrees(parser)
    parser.add_argument("--steps", type=int, action=_Once)
    _add_options(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0, help="wall timeout in seconds (> 0; inf: none)")
    parser.add_argument("--out", help="run directory (default: a new temporary one)")
    parser.add_argument("--quiet", action="store_true", help="do not stream the workers' lines")
    parser.add_argument(
        "--link",
        help="emulate a slow link: a preset (notebook, slow, lan) or 'LATENCY,RATE' such as '2ms,1MB/s' "
        "(docs/cli.md, Emulated link)",
    )
    parser.add_argument(
        "--no-figures", action="store_true", help="do not draw the figures (PNG + SVG) into the run directory"
    )
    parser.add_argument(
        "--chrome-trace",
        action="store_true",
        help="also write chrome_trace.json (open it in Perfetto / chrome://tracing)",
    )


def _add_command(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe")
    _add_degrees(parser)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--rdzv-endpoint", default="$MASTER_ADDR:29500", help="HOST:PORT of the rendezvous")
    parser.add_argument("--steps", type=int, action=_Once)
    _add_options(parser)
    parser.add_argument("--out", help="run directory each node writes into (default: runs/RECIPE-<rdzv id>)")


def _add_plan(parser: argparse.ArgumentParser) -> None:
    from launch.plan.flags import add_arguments

    _add_degrees(parser)
    add_arguments(parser)


def _add_workbook(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs")
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="notebooks run at a time (1: one after another); each worker keeps one kernel, reset between notebooks",
    )


def _add_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", nargs="?", help="a run directory (holds summary.json, metrics.json, trace_rank*.json)"
    )
    parser.add_argument("--out", help="the HTML file to write (default: RUN_DIR/report.html)")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("RUN_A", "RUN_B"),
        help="two runs side by side (default --out: compare.html next to RUN_A)",
    )


@dataclass(frozen=True)
class Subcommand:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


SUBCOMMANDS = {
    "list": Subcommand("the recipe matrix", lambda parser: None, lambda args: cmd_list()),
    "check": Subcommand("validate degrees and show the mesh views and groups", _add_check, cmd_check),
    "run": Subcommand("run a recipe on torchrun workers against its reference", _add_run, cmd_run),
    "command": Subcommand("print the multi-node torchrun command of a recipe", _add_command, cmd_command),
    "plan": Subcommand("check and cost a layout of up to thousands of ranks (no workers)", _add_plan, cmd_plan),
    "workbook": Subcommand("run the workbook headless", _add_workbook, cmd_workbook),
    "bench-latency": Subcommand(
        "wall time of a run: fresh launch, first and warm pool run",
        bench_flags.add_latency_arguments,
        bench_flags.cmd_latency,
    ),
    "bench": Subcommand(
        "our fully_shard against torch FSDP2, steps alternated in one run",
        bench_flags.add_arguments,
        bench_flags.cmd_bench,
    ),
    "report": Subcommand("write a self-contained HTML report of a run directory", _add_report, cmd_report),
}
"""Every subcommand of ``python -m launch``: its help line, its flags and what runs it."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in SUBCOMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[2:] if argv is None else list(argv[1:])  # plan's review page quotes its command
    try:
        return SUBCOMMANDS[args.command].run(args)
    except (ValueError, RunDirError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as error:
        if error.errno not in NO_SPACE:
            raise
        if not isinstance(error, NoSpaceError):
            error = no_space(Path(error.filename).parent if error.filename else "the output folder", error)
        print(f"error: {error.strerror}", file=sys.stderr)
        return EXIT_NO_SPACE
