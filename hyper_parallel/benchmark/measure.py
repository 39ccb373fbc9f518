"""What one training step costs: wall time over all ranks, peak memory, and torch FSDP2's collectives.

Memory: on CUDA the caching allocator's peak; on CPU, where torch keeps no allocator statistics, the
profiler's allocation records of the training thread. Either way

    peak = resident + transient,

``resident`` = the distinct storages the model and optimizer hold between steps (sharded parameters,
buffers, optimizer state), ``transient`` = the highest point allocations made during the step reach
above the memory in use when it started (unsharded parameters, gradients, activations, buffers).
The same formula is applied to both implementations, so the comparison does not depend on the
other model being alive in the same process.

Limit on CPU: the profiler records allocations and frees of the thread it runs on. A tensor whose
last reference gloo's worker thread drops is freed there, unrecorded, and counts as live until the
step ends; that can overstate a step's transient peak by a communication buffer or two, at random.
Our fully_shard frees its own buffers on the training thread (``comm.release``); torch FSDP2's and
DTensor's are exposed to it, so the benchmark keeps the smallest of several profiled steps.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hyper_parallel import trace


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_step(step: Callable[[], float], device: torch.device) -> tuple[float, float]:
    """Seconds of one step and of its forward + backward (``step``'s return value) on the slowest rank:
    the ranks start together (barrier) and the step ends for the job when its last rank finishes
    (``device``: where the process group's collectives take their tensors)."""
    synchronize()
    dist.barrier()
    start = time.perf_counter()
    forward_backward = step()
    synchronize()
    elapsed = torch.tensor([time.perf_counter() - start, forward_backward], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed[0]), float(elapsed[1])


def resident_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the distinct storages behind parameters, buffers and optimizer state (this rank)."""
    tensors = [*model.parameters(), *model.buffers()]
    for state in optimizer.state.values():
        tensors.extend(value for value in state.values() if isinstance(value, torch.Tensor))
    storages = {}
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def transient_peak_bytes(step: Callable[[], None]) -> int:
    """The highest the bytes allocated during ``step`` (net of what it frees) climb above its start."""
    if torch.cuda.is_available():
        synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        synchronize()
        return torch.cuda.max_memory_allocated() - start
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as profiler:
        step()
    records = [e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
    records.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for record in records:
        current += record.nbytes()
        peak = max(peak, current)
    return peak


# torch.distributed function -> (trace op, the argument holding the full, unsharded buffer)
_TORCH_FSDP_OPS = {
    "all_gather_single": ("all_gather", "output_tensor"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "all_reduce": ("all_reduce", "tensor"),
}


def _torch_unit_name() -> str:
    """The module fqn of the FSDP2 parameter group issuing a collective (found on the call stack)."""
    frame = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "FSDPParamGroup":
            return owner._module_fqn or "root"
        frame = frame.f_back
    return ""


@contextlib.contextmanager
def trace_torch_fsdp(group_names: dict[tuple[int, ...], str]) -> Iterator[None]:
    """Record the c10d collectives torch FSDP2 issues (``dist.all_gather_single`` and friends) as
    trace events like ours: op, mesh dim name, ranks, full-buffer bytes, the unit's module fqn.

    FSDP2 calls these through the ``torch.distributed`` module, so wrapping them there for the
    duration of the block sees every call; our own ``fully_shard`` must not run inside the block
    (it uses the same functions and records itself).
    """
    originals = {name: getattr(dist, name) for name in _TORCH_FSDP_OPS}

    def wrap(name: str, original):
        op, buffer_argument = _TORCH_FSDP_OPS[name]
        signature = inspect.signature(original)

        def traced(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            buffer, group = bound.arguments[buffer_argument], bound.arguments.get("group")
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
            group_name = group_names.get(tuple(sorted(ranks)), f"ranks{ranks}")
            with trace.collective(
                op, group_name, ranks, buffer.numel() * buffer.element_size(), buffer.dtype, module=_torch_unit_name()
            ):
                work = original(*args, **kwargs)
                if bound.arguments.get("async_op") and work is not None:
                    work.wait()
            return work

        return traced

    for name, original in originals.items():
        setattr(dist, name, wrap(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
