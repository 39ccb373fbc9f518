"""``python -m launch bench`` and ``bench-latency``: their flags and what runs for them (``launch.cli`` lists them).

The benchmarks themselves are ``fsdp2.py`` and ``latency.py``, imported only when one runs.
"""

from __future__ import annotations

import argparse
import sys


def cmd_bench(args: argparse.Namespace) -> int:
    from launch.bench.fsdp2 import print_bench, run_bench

    def show(rank: int, line: str) -> None:
        if rank <= 0:
            print(line, flush=True)

    configs = [name for name in (args.configs or "").split(",") if name]
    result = run_bench(
        args.world_size,
        steps=args.steps,
        warmup=args.warmup,
        cold=args.cold,
        out=args.out,
        configs=configs,
        timeout=args.timeout,
        profile=args.profile,
        on_line=show,
        overlap=not args.no_overlap,
    )
    if not result.ok:
        print(f"FAILED: {result.error}", file=sys.stderr)
        return 1
    print_bench(result)
    return 0


def cmd_latency(args: argparse.Namespace) -> int:
    from launch import inputs
    from launch.bench.latency import measure, measure_resources, print_latency, print_resources

    inputs.positive_int(args.repeats, "--repeats")  # both before the first run
    inputs.positive_int(args.runs, "--runs")
    print_latency(measure(args.repeats), args.repeats)
    print_resources(measure_resources(args.runs))
    return 0


def add_latency_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5, help="runs per column (medians are printed)")
    parser.add_argument("--runs", type=int, default=20, help="warm runs before threads/fds per worker are counted")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--world",
        dest="world_size",
        type=int,
        default=4,
        choices=(2, 4),
        help="ranks: 2 runs FSDP; 4 runs FSDP, HSDP, FSDP+TP and the multi-dim S2",
    )
    parser.add_argument("--steps", type=int, default=20, help="timed pairs per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each implementation first")
    parser.add_argument(
        "--cold",
        type=int,
        default=3,
        help="pairs of cold steps (DTensor's caches cleared before each), after the first",
    )
    parser.add_argument("--configs", help="comma-separated subset, e.g. FSDP,HSDP")
    parser.add_argument("--out", help="directory for bench.json, the figure and traces (default: a new temporary one)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="wall timeout in seconds")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile 3 steps of each (torch.profiler): DIR/<config>/profile_<impl>.txt",
    )
    parser.add_argument(
        "--no-overlap",
        action="store_true",
        help="ours issues every collective synchronously (no prefetch, no reduction in flight)",
    )
