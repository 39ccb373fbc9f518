"""``python -m launch bench``: our fully_shard against torch FSDP2 in one torchrun launch.

The workers (``hyper_parallel.benchmark.worker``) alternate the two implementations step by step and
write ``bench.json`` and the traced step's files; this module starts them, reads those, adds the
communication against fully_shard's theoretical minimum, prints the table and draws the figures.
Torch-free.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyper_parallel.benchmark.configs import (
    BENCH_FILE,
    IMPLEMENTATIONS,
    BenchModel,
    async_tp_ratio,
    configurations,
    summarize,
)
from hyper_parallel.mesh_dims import FSDP_GROUPS
from hyper_parallel.run_files import load_traces
from hyper_parallel.viz.overlap import exposure
from hyper_parallel.viz.style import OP_SHORT
from hyper_parallel.viz.timeline import collectives
from hyper_parallel.viz.volume import measured_bytes, theoretical_bytes
from launch import inputs
from launch.processes.pool import run_as_launch
from launch.processes.run_dirs import claimed, make_run_dir, new_scratch_dir
from launch.processes.supervisor import TorchrunResult, torchrun

WORKER_MODULE = "hyper_parallel.benchmark.worker"


@dataclass
class BenchResult:
    directory: Path
    process: TorchrunResult
    payload: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.process.returncode == 0 and bool(self.rows)

    def losses_disagree(self) -> list[str]:
        """The configurations whose two implementations' losses differ beyond ``BenchConfig.loss_rtol``."""
        world = self.payload["world_size"]
        rtol = {config.name: config.loss_rtol for config in configurations(world, include_optional=True)}
        return [
            row["config"]
            for row, config in zip(self.rows, self.payload["configs"])
            if any(
                abs(ours - theirs) > rtol[row["config"]] * abs(theirs)
                for ours, theirs in zip(config["losses"]["ours"], config["losses"]["torch"])
            )
        ]

    @property
    def error(self) -> str | None:
        if self.ok:
            return None
        return self.process.error or f"the workers wrote no {BENCH_FILE} into {self.directory}"

    def __repr__(self) -> str:
        """Status, one line per configuration, the directory: the big fields (payload, rows) stay out."""
        if not self.ok:
            return f"BenchResult(FAILED, {self.directory}: {(self.error or '').splitlines()[-1:]})"
        lines = [
            f"  {r['config']}: ratio {r['ratio']['median']:.3f} [{r['ratio']['q1']:.2f}-{r['ratio']['q3']:.2f}], "
            f"{r['median_ms']['ours']:.1f} / {r['median_ms']['torch']:.1f} ms, first step ratio {r['first_ratio']:.2f}"
            for r in self.rows
        ]
        return f"BenchResult(ok, {self.payload.get('world_size')} ranks, {self.directory}\n" + "\n".join(lines) + ")"

    def _repr_html_(self) -> str:
        from launch.tables import table

        return (
            table(
                list(TABLE_HEADER),
                [list(row) for row in table_rows(self.rows)],
                caption=f"{self.payload.get('world_size')} ranks, {self.directory}",
            ).data
            if self.ok
            else f"<pre>{html.escape(repr(self))}</pre>"
        )


def communication(directory: Path, config: str, impl: str) -> dict[str, Any]:
    """Rank 0's collectives in the traced step of ``impl`` on ``config``: bytes and count per (op, group)
    (``viz.volume.measured_bytes``), and the count per fully_shard unit and (op, group)."""
    traces = load_traces(directory / config / impl)
    total, count = measured_bytes(traces, step=0, rank=0)
    per_unit: dict[str, Counter] = {}
    for _, event in collectives(traces, step=0, rank=0):
        per_unit.setdefault(event["module"] or "-", Counter())[(event["op"], event["group"])] += 1
    return {"bytes": total, "count": count, "per_unit": per_unit}


def unit_pattern(per_unit: dict[str, Counter]) -> str:
    """Collectives of one step per fully_shard unit on FSDP groups, e.g. 'root 1 AG + 1 RS; 4 blocks 2 AG + 1 RS'."""
    patterns: Counter = Counter()
    for unit, counts in per_unit.items():
        parts = []
        for op in ("all_gather", "reduce_scatter", "all_reduce"):
            n = sum(c for (kind, group), c in counts.items() if kind == op and group in FSDP_GROUPS)
            if n:
                parts.append(f"{n} {OP_SHORT[op]}")
        if parts:
            kind = "root" if unit == "root" else "block"
            patterns[(kind, " + ".join(parts))] += 1
    return "; ".join(
        f"{count} {kind}{'s' if count > 1 else ''} {text}" if kind != "root" else f"root {text}"
        for (kind, text), count in sorted(patterns.items())
    )


def add_communication(row: dict[str, Any], directory: Path, units: list[dict[str, Any]]) -> dict[str, Any]:
    """The traced step's collectives of both implementations, and their bytes on FSDP groups against
    fully_shard's minimum (``viz.volume.theoretical_bytes``)."""
    minimum = sum(theoretical_bytes(units).values())
    row["communication"] = {impl: communication(directory, row["config"], impl) for impl in IMPLEMENTATIONS}
    row["fsdp_bytes"] = {
        impl: sum(b for (_, group), b in row["communication"][impl]["bytes"].items() if group in FSDP_GROUPS)
        for impl in IMPLEMENTATIONS
    }
    row["bytes_minimum"] = minimum
    row["bytes_ratio"] = {
        impl: row["fsdp_bytes"][impl] / minimum if minimum else float("nan") for impl in IMPLEMENTATIONS
    }
    row["per_unit"] = {impl: unit_pattern(row["communication"][impl]["per_unit"]) for impl in IMPLEMENTATIONS}
    row["peak_mib"] = {impl: max(r + t for r, t in row["peak_memory"][impl]) / 2**20 for impl in IMPLEMENTATIONS}
    row["exposure_ms"] = {impl: step_exposure_ms(directory / row["config"] / impl) for impl in IMPLEMENTATIONS}
    return row


def step_exposure_ms(directory: Path) -> dict[str, float]:
    """The traced step's communication in flight and exposed (no compute running), in ms, on the rank
    where it is largest (the step waits for its slowest rank); both implementations' compute is marked the
    same way (the benchmark worker's ``_compute_spans``). Torch FSDP2's collectives block on CPU (its
    streams are CUDA's), so all of its communication comes out exposed there."""
    per_rank = exposure(load_traces(directory), step=0)
    worst = max(per_rank.values(), key=lambda numbers: numbers["exposed"])
    return {key: 1e3 * value for key, value in worst.items()}


def run_bench(
    world_size: int = 4,
    steps: int = 20,
    warmup: int = 3,
    out: str | Path | None = None,
    cold: int = 3,
    configs: list[str] | None = None,
    model: dict[str, int] | None = None,
    timeout: float = 1200.0,
    profile: bool = False,
    on_line: Callable[[int, str], None] | None = None,
    overlap: bool = True,
    pool: bool = False,
) -> BenchResult:
    """Start the benchmark workers and summarise what they measured (validation happens first).

    ``pool=False`` (the CLI's) starts a torchrun launch, as a training job starts; ``pool=True`` runs it on
    this process's warm workers (``launch.processes.pool``), without starting processes and importing
    torch again: the same steps and numbers, DTensor's sharding memo bypassed so the first and cold steps
    still pay the sharding propagation of a fresh launch (``worker.run_on_warm_rank``)."""
    known = [c.name for c in configurations(world_size)]
    unknown = sorted(set(configs or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown} on {world_size} ranks; choose from {known}")
    if steps < 1 or warmup < 0 or cold < 0:
        raise ValueError(f"--steps must be >= 1, --warmup and --cold >= 0, got {steps}, {warmup} and {cold}")
    timeout = inputs.timeout(timeout, "--timeout")
    inputs.callback(on_line, "on_line")
    if inputs.flag(pool, "pool"):
        inputs.start_timeout()  # the pool's cold-start limit: refused before any folder is made
    BenchModel(**(model or {}))  # unknown fields raise TypeError here, not on every rank
    out = inputs.out_dir(out)
    directory = make_run_dir(out) if out is not None else new_scratch_dir("hp-bench-")
    (directory / BENCH_FILE).unlink(missing_ok=True)
    args = [
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--cold",
        str(cold),
        "--configs",
        ",".join(configs or ()),
        "--model",
        json.dumps(model or {}),
        "--out",
        str(directory),
        "--collective-timeout",
        str(max(60.0, timeout)),
    ]
    if profile:
        args.append("--profile")
    if not overlap:
        args.append("--no-overlap")
    if pool:
        with claimed(directory):
            process = run_as_launch(world_size, {"kind": "bench", "args": args}, timeout, on_line, directory)
    else:
        process = torchrun(WORKER_MODULE, world_size, args=args, timeout=timeout, on_line=on_line, run_dir=directory)
    result = BenchResult(directory, process)
    path = directory / BENCH_FILE
    if process.returncode == 0 and path.exists():
        result.payload = json.loads(path.read_text())
        result.rows = [add_communication(summarize(c), directory, c["units"]) for c in result.payload["configs"]]
    return result


def table_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    out = []
    for row in rows:
        ratio, fb = row["ratio"], row["forward_backward_ratio"]
        out.append(
            (
                row["config"],
                f"{row['median_ms']['ours']:.1f}",
                f"{row['median_ms']['torch']:.1f}",
                f"{ratio['median']:.3f} [{ratio['q1']:.2f}-{ratio['q3']:.2f}]",
                f"{fb['median']:.3f}",
                f"{row['first_ms']['ours']:.0f} / {row['first_ms']['torch']:.0f} ({row['first_ratio']:.2f})",
                f"{row['cold_ratio']['median']:.2f}",
                f"{row['bytes_ratio']['ours']:.3f} / {row['bytes_ratio']['torch']:.3f}",
                *(
                    f"{row['exposure_ms'][impl]['exposed']:.1f} of {row['exposure_ms'][impl]['in_flight']:.1f}"
                    for impl in IMPLEMENTATIONS
                ),
                f"{row['peak_mib']['ours']:.2f} / {row['peak_mib']['torch']:.2f}",
                f"{row['max_loss_diff']:.1e}",
            )
        )
    return out


TABLE_HEADER = (
    "config",
    "ours ms",
    "torch ms",
    "ratio [quartiles]",
    "fwd+bwd ratio",
    "first step ms ours / torch (ratio)",
    "cold ratio",
    "bytes/min ours/torch",
    "ours: comm exposed of in flight, ms",
    "torch: comm exposed of in flight, ms",
    "peak MiB ours/torch",
    "loss diff",
)


def bench_table(result: BenchResult):
    """The printed table as a notebook table."""
    from launch.tables import table

    return table(
        list(TABLE_HEADER),
        [list(row) for row in table_rows(result.rows)],
        caption="ratio: median of ours/torch over adjacent step pairs (below 1: ours faster); "
        "first step / cold ratio: steps with DTensor's caches cleared before each (as a fresh run starts); "
        "bytes/min: bytes on FSDP groups per step over fully_shard's minimum; comm exposed of in flight: ms "
        "of the traced step in which a collective was in flight and no compute ran, of the ms any was in "
        "flight (the rank with the most exposed); peak: largest rank, resident state + the step's transient peak",
    )


def bench_figures(
    result: BenchResult,
    figures_dir: str | Path | None = None,
    timeline_config: str | None = None,
    svg: bool = False,
) -> dict[str, Any]:
    """The ratio figure and the two timelines of ``timeline_config`` (default: the last configuration),
    saved as PNG (and SVG, with ``svg``) into ``figures_dir`` when it is given."""
    from hyper_parallel.viz import save
    from hyper_parallel.viz.benchmark import implementation_timelines, ratio_figure

    config = timeline_config or result.rows[-1]["config"]
    ours, theirs = implementation_timelines(result.directory, config)
    figures = {
        "bench": ratio_figure(result.rows, result.payload["world_size"]),
        "timeline_ours": ours,
        "timeline_torch": theirs,
    }
    if figures_dir is not None:
        for name, fig in figures.items():
            save(fig, figures_dir, name, svg=svg)
    return figures


def print_bench(result: BenchResult) -> None:
    """What ``python -m launch bench`` prints after a run, and the figures it writes next to bench.json."""
    from launch.tables import print_table

    payload = result.payload
    print(
        f"\n{payload['world_size']} ranks, {payload['backend']}, torch {payload['torch']}, {payload['steps']} "
        f"alternated pairs per configuration after {payload['warmup']} warm-up steps; model {payload['model']}; "
        f"our overlap {'on' if payload.get('overlap', True) else 'off'}"
    )
    print_table(TABLE_HEADER, table_rows(result.rows))
    print(
        "\nratio: median of ours/torch over adjacent pairs of warm steps (below 1: ours faster); first step: "
        "each one's first step, DTensor's caches cleared before it (as every fresh launch starts); cold "
        "ratio: median of ours/torch over pairs of steps with the caches cleared before each; "
        "bytes/min: bytes on FSDP "
        "groups per step over fully_shard's minimum; comm exposed of in flight: ms of the traced step in which a collective was "
        "in flight and no compute ran, of the ms any was in flight (the rank with the most exposed); peak: "
        "largest rank, resident + the step's transient peak"
    )
    for row in result.rows:
        print(
            f"collectives per step, {row['config']}: ours {row['per_unit']['ours']}; torch {row['per_unit']['torch']}"
        )
    ratio = async_tp_ratio(result.rows)
    if ratio is not None:
        print(
            f"async TP+SP / synchronous TP+SP, both under our fully_shard: {ratio:.3f} "
            "(AsyncTP's median ratio over TP+SP's, against the same torch stack)"
        )
    figures = bench_figures(result, result.directory, svg=True)
    print(
        f"figures: {', '.join(f'{name}.png/.svg' for name in figures)} in {result.directory}\n"
        f"bench.json: {result.directory / BENCH_FILE}"
    )
