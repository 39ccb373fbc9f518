"""What torch's DistributedDataParallel does with the gradients (notebook 01_ddp_fsdp): buckets, measured.

DDP packs the gradients into buckets of ``bucket_cap_mb`` and all-reduces a bucket as soon as its last
gradient is ready, while backward goes on computing the others. On torch 2.13 the first step runs with a
single bucket (the parameters' order in backward is not known yet: ``compute_bucket_size_limits`` in
``torch/nn/parallel/distributed.py``); after it, the reducer rebuilds the buckets in the order the
gradients arrived, each closed once it holds ``bucket_cap_mb`` or more.

The probe wraps M1's MLP (the model 01 trains) in DDP on the gloo group and records, every step on this
rank: each bucket's all-reduce (a comm hook, the same all-reduce and average DDP's default does) as a
collective of the trace (``module`` "bucket i", its parameters' names, issue and completion times), and
the moment each parameter's gradient is accumulated. A bucket issued before the last gradient is ready
overlaps backward's compute.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from hyper_parallel import trace
from hyper_parallel.models.mlp import MLP, MLPConfig, mlp_batch

GLOBAL_BATCH = 16
LEARNING_RATE = 0.05


def _averaging_hook(names: dict[int, str]):
    """DDP's default reduction (all-reduce the bucket's flat buffer, divide by the world size) with each
    bucket traced: ``names`` maps a parameter's id to its name."""

    def hook(_state, bucket):  # unannotated: DDP checks annotations, which postponed evaluation makes strings
        buffer = bucket.buffer()
        recorder = trace.current()  # the completion callback may run on gloo's thread, which has none
        completed = trace.issued(
            "all_reduce",
            "dp_replicate",
            list(range(dist.get_world_size())),
            buffer.numel() * buffer.element_size(),
            buffer.dtype,
            module=f"bucket {bucket.index()}",
            parameters=[names[id(p)] for p in bucket.parameters()],
        )
        work = dist.all_reduce(buffer, async_op=True)

        def averaged(future: torch.futures.Future) -> torch.Tensor:
            if completed is not None:
                completed(recorder.now(), True)
            return future.value()[0].div_(dist.get_world_size())

        return work.get_future().then(averaged)

    return hook


def _record_gradient_arrivals(model: torch.nn.Module) -> None:
    """A ``gradient`` event (parameter name, time) each time autograd accumulates a parameter's gradient."""
    for name, parameter in model.named_parameters():

        def arrived(_parameter: torch.Tensor, name: str = name) -> None:
            recorder = trace.current()
            if recorder is not None:
                recorder.events.append(
                    {"kind": "gradient", "parameter": name, "step": recorder.step, "t_start": recorder.now()}
                )

        parameter.register_post_accumulate_grad_hook(arrived)


def _rank_rows(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = mlp_batch(MLPConfig(), GLOBAL_BATCH, 0)
    rows = GLOBAL_BATCH // world_size
    return x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]


def ddp_bucket_probe(bucket_cap_mb: float = 1 / 64, steps: int = 3, seed: int = 0) -> dict:
    """Train M1's MLP with torch's DDP for ``steps`` SGD steps; this rank's trace (buckets, gradient arrivals,
    backward's start and end per step as ``backward`` spans), its losses and its final parameters."""
    if GLOBAL_BATCH % dist.get_world_size():
        raise ValueError(f"{GLOBAL_BATCH} rows do not split over {dist.get_world_size()} ranks; use 1, 2, 4, 8 or 16")
    torch.manual_seed(seed)
    model = MLP(MLPConfig())
    names = {id(p): name for name, p in model.named_parameters()}
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    ddp.register_comm_hook(None, _averaging_hook(names))
    _record_gradient_arrivals(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE)
    x, y = _rank_rows(dist.get_rank(), dist.get_world_size())
    losses = []
    with trace.record() as recorder:
        for step in range(steps):
            trace.set_step(step)
            loss = F.mse_loss(ddp(x), y)
            with trace.span("backward"):
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return {
        "bucket_cap_bytes": int(bucket_cap_mb * 1024 * 1024),
        "events": recorder.events,
        "losses": losses,
        "parameters": {name: p.detach().tolist() for name, p in model.named_parameters()},
    }


def single_process_reference(steps: int = 3, seed: int = 0) -> dict[str, list]:
    """The same model trained on the whole batch in one process: the mean over ranks of equal row counts is
    the whole batch's mean, so DDP's parameters must equal these to float32 rounding."""
    torch.manual_seed(seed)
    model = MLP(MLPConfig())
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    x, y = mlp_batch(MLPConfig(), GLOBAL_BATCH, 0)
    for _ in range(steps):
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: p.detach().tolist() for name, p in model.named_parameters()}
