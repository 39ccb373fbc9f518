"""Worker for tests/test_async_tp.py: the pipelined collectives of ``parallel.async_tp`` against the one-shot ones.

On 4 ranks, for tp groups of 4 and of 2 and every chunk count that cuts the shard, it runs each of
``AllGatherLinear`` (gather, then wq/wk/wv-like weights) and ``LinearReduceScatter`` (matmul, then
scatter) forward and backward, and the same computation through ``autograd_comm``'s one-shot
all-gather / reduce-scatter and ``F.linear``: outputs and every gradient are compared (float64 and
float32), and the traced collectives of both are recorded (bytes, chunk, issue / wait / end) with the
compute spans between them. Output: $HYPER_PARALLEL_RUN_DIR/async_tp_rank<R>.json.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from case_runner import run_cases

from hyper_parallel import trace
from hyper_parallel.comm import GroupInfo
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import build_mesh
from hyper_parallel.parallel.async_tp import AllGatherLinear, LinearReduceScatter
from hyper_parallel.parallel.autograd_comm import AllGatherWithReduceScatterBackward, ReduceScatterWithAllGatherBackward

BATCH, SEQ, D_MODEL, HIDDEN = 2, 16, 8, 12
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def _inputs(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    """The same tensor on every rank of a group for a given seed (different seeds per rank give shards)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()


def _traced(run) -> tuple[object, list[dict]]:
    """Run ``run()`` with a recorder and an open compute span (as inside a root's forward)."""
    with trace.record() as recorder:
        with trace.outside_compute(start_after=True):  # open a compute span, as a root's forward does
            pass
        out = run()
        with trace.outside_compute(start_after=False):  # close it, as the end of backward does
            pass
    keep = ("kind", "op", "bytes", "chunk", "group", "asynchronous", "t_start", "t_wait", "t_end")
    return out, [{k: e[k] for k in keep if k in e} for e in recorder.events]


def _grads(tensors) -> list[torch.Tensor]:
    return [t.grad.detach().clone() for t in tensors]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def gather_case(tp: GroupInfo, chunks: int, dtype: torch.dtype) -> dict:
    """x shard [B, S/tp, D] -> outputs [B, S, H_i] for three weights; loss = sum of (out * a fixed probe)."""
    me = tp.index
    shard_len = SEQ // tp.size
    x = _inputs((BATCH, shard_len, D_MODEL), 100 + tp.ranks[me], dtype)
    weights = [_inputs((HIDDEN // (i + 1), D_MODEL), 200 + i + 10 * me, dtype) for i in range(3)]
    probes = [
        torch.randn(BATCH, SEQ, w.shape[0], generator=torch.Generator().manual_seed(300 + i), dtype=dtype)
        for i, w in enumerate(weights)
    ]

    def pipelined():
        outs = AllGatherLinear.apply(x, 1, tp, chunks, *weights)
        sum(((o * p).sum() for o, p in zip(outs, probes))).backward()
        return [o.detach() for o in outs]

    outs, events = _traced(pipelined)
    grads = _grads([x, *weights])
    for t in (x, *weights):
        t.grad = None

    def one_shot():
        full = AllGatherWithReduceScatterBackward.apply(x, 1, tp)
        outs = [F.linear(full, w) for w in weights]
        sum(((o * p).sum() for o, p in zip(outs, probes))).backward()
        return [o.detach() for o in outs]

    expected, reference_events = _traced(one_shot)
    return {
        "out_diff": _max_diff(outs, expected),
        "grad_diff": _max_diff(grads, _grads([x, *weights])),
        "events": events,
        "reference_events": reference_events,
    }


def scatter_case(tp: GroupInfo, chunks: int, dtype: torch.dtype) -> dict:
    """a [B, S, H/tp] -> this rank's [B, S/tp, D] of the sum over tp of a @ w^T."""
    me = tp.index
    a = _inputs((BATCH, SEQ, HIDDEN), 400 + me, dtype)
    weight = _inputs((D_MODEL, HIDDEN), 500 + me, dtype)
    probe = torch.randn(BATCH, SEQ // tp.size, D_MODEL, generator=torch.Generator().manual_seed(600 + me), dtype=dtype)

    def pipelined():
        out = LinearReduceScatter.apply(a, weight, 1, tp, chunks)
        (out * probe).sum().backward()
        return [out.detach()]

    outs, events = _traced(pipelined)
    grads = _grads([a, weight])
    a.grad = weight.grad = None

    def one_shot():
        out = ReduceScatterWithAllGatherBackward.apply(F.linear(a, weight), 1, tp)
        (out * probe).sum().backward()
        return [out.detach()]

    expected, reference_events = _traced(one_shot)
    return {
        "out_diff": _max_diff(outs, expected),
        "grad_diff": _max_diff(grads, _grads([a, weight])),
        "events": events,
        "reference_events": reference_events,
    }


def layouts(world: int) -> dict[str, GroupInfo]:
    out = {}
    for tp in (world, 2):
        views = build_mesh(ParallelDims(world_size=world, tp=tp, dp_shard=world // tp), "cpu")
        out[f"tp{tp}"] = GroupInfo.from_mesh(views[MeshDim.TP], (MeshDim.TP,))
    return out


def cases(world: int) -> dict:
    registered = {}
    for layout, tp in layouts(world).items():
        shard_len = SEQ // tp.size
        for chunks in (c for c in (1, 2, 4) if shard_len % c == 0):
            for dtype_name, dtype in DTYPES.items():
                for kind, case in (("gather", gather_case), ("scatter", scatter_case)):
                    name = f"{kind}-{layout}-c{chunks}-{dtype_name}"
                    registered[name] = lambda case=case, tp=tp, chunks=chunks, dtype=dtype: case(tp, chunks, dtype)
    return registered


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    out = Path(os.environ["HYPER_PARALLEL_RUN_DIR"]) / f"async_tp_rank{dist.get_rank()}.json"
    run_cases(cases(dist.get_world_size()), "all", out)


if __name__ == "__main__":
    main()
