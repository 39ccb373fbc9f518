"""Worker for tests/test_gloo_sum.py: our reduce-scatter against gloo's own, on groups of 2, 3 and 4 ranks.

For each group, dtype and buffer size, every rank builds the same n random buffers (one per group position)
and compares, element by element, ``comm.reduce_scatter_tensor`` (sync and async) with gloo's
``dist.reduce_scatter_tensor`` on the same inputs. It also counts the elements where a plain ring order
(every element summed as its owner's chunk) differs from gloo, so the test can see that the sizes chosen
exercise the chunk boundaries. Wire bytes per collective are this process's ``/proc/self/io`` wchar
before and after it. Results go to $HYPER_PARALLEL_RUN_DIR/gloo_sum_rank<R>.json.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from case_runner import run_cases

from hyper_parallel import comm
from hyper_parallel.comm import GroupInfo

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SIZES = (36, 100, 1000, 65532)  # per rank count; 36 and 100 over 4: chunk boundaries off by the segment rounding
LARGE = {4: 6000004, 3: 4194300}  # fp32 buffers with segments capped at 1 MiB and boundaries that move with it
WIRE_BYTES = 1 << 20


def buffers(n: int, numel: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=generator, dtype=torch.float64).to(dtype) for _ in range(n)]


def owner_order_sum(xs: list[torch.Tensor], index: int) -> torch.Tensor:
    """The sum of position ``index``'s chunk as a plain ring ending at ``index`` would make it."""
    n = len(xs)
    shard = xs[0].numel() // n
    parts = [x[index * shard : (index + 1) * shard] for x in xs]
    acc = parts[(index - 1) % n].clone()
    for step in range(2, n + 1):
        acc = acc + parts[(index - step) % n]
    return acc


def compare(info: GroupInfo, numel: int, dtype: torch.dtype) -> dict:
    xs = buffers(info.size, numel, dtype, seed=numel * 7 + info.size)
    mine = xs[info.index]
    theirs = torch.empty(numel // info.size, dtype=dtype)
    dist.reduce_scatter_tensor(theirs, mine.clone(), group=info.group)
    ours = torch.empty_like(theirs)
    comm.reduce_scatter_tensor(ours, mine.clone(), info)
    ours_async = torch.empty_like(theirs)
    comm.reduce_scatter_tensor(ours_async, mine.clone(), info, async_op=True).wait()
    return {
        "group": list(info.ranks),
        "numel": numel,
        "dtype": str(dtype),
        "differ": int((ours != theirs).sum()),
        "differ_async": int((ours_async != theirs).sum()),
        "owner_order_differs": int((owner_order_sum(xs, info.index) != theirs).sum()),
    }


def wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar line")


def wire(info: GroupInfo) -> dict:
    """Bytes this rank writes for one collective of a WIRE_BYTES buffer over the ring bound of that collective."""
    n, numel = info.size, WIRE_BYTES // 4
    full, shard = torch.randn(numel), torch.randn(numel // n)
    bound = (n - 1) / n * WIRE_BYTES
    calls = {
        "reduce_scatter": (lambda: comm.reduce_scatter_tensor(torch.empty(numel // n), full.clone(), info), bound),
        "gloo reduce_scatter": (
            lambda: dist.reduce_scatter_tensor(torch.empty(numel // n), full.clone(), group=info.group),
            bound,
        ),
        "all_gather": (lambda: comm.all_gather_into_tensor(torch.empty(numel), shard, info), bound),
        "all_reduce": (lambda: comm.all_reduce(full.clone(), info), 2 * bound),
    }
    ratios = {}
    for name, (call, ring_bound) in calls.items():
        call()  # first use of the group's connections out of the count
        dist.barrier(group=info.group)
        before = wchar()
        call()
        ratios[name] = (wchar() - before) / ring_bound
        dist.barrier(group=info.group)
    return ratios


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    world = dist.get_world_size()
    groups = {n: dist.new_group(list(range(n))) for n in (2, 3) if n < world}
    rank = dist.get_rank()

    def info_of(n: int) -> GroupInfo | None:
        if rank >= n:
            return None
        return GroupInfo(f"g{n}", tuple(range(n)), groups.get(n, dist.group.WORLD))

    def exact(n: int):
        def case() -> list[dict]:
            info = info_of(n)
            if info is None:
                return []
            rows = [compare(info, size * n, dtype) for dtype in DTYPES for size in SIZES]
            if n in LARGE:
                rows.append(compare(info, LARGE[n], torch.float32))
            return rows

        return case

    def wire_case(n: int):
        def case() -> dict:
            info = info_of(n)
            return {} if info is None else wire(info)

        return case

    cases = {f"exact_{n}": exact(n) for n in (2, 3, world)}
    cases.update({f"wire_{n}": wire_case(n) for n in (2, world)})
    out = Path(os.environ["HYPER_PARALLEL_RUN_DIR"]) / f"gloo_sum_rank{rank}.json"
    run_cases(cases, "all", out)


if __name__ == "__main__":
    main()
