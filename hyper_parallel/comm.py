"""Process groups as ``GroupInfo`` and the traced collectives every parallel style goes through.

Each collective records one trace event (op, group name, global ranks, full buffer bytes). A group
of size 1 issues nothing and records nothing: there is no communication to see. Under an emulated link
(``hyper_parallel.link``) each one completes no earlier than α + n·β after it was issued: the wait (the
synchronous call, or ``PendingCollective.wait``) sleeps until then, inside its trace event.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from hyper_parallel import link, trace
from hyper_parallel.gloo_sum import DirectReduceScatter, uses_gloo
from hyper_parallel.mesh_slices import sub_mesh


@dataclass(frozen=True, eq=False)
class GroupInfo:
    """A communication group: its name (mesh dim names joined by '+'), global ranks and process group.

    docs/design.md §3: every fully_shard parameter has a ``sharded_group_info`` (reduce-scatter) and an
    ``unsharded_group_info`` (all-reduce); TP, CP and EP use the same type for their groups.
    """

    name: str
    ranks: tuple[int, ...]
    group: dist.ProcessGroup | None

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def index(self) -> int:
        """This rank's position in the group (its chunk of a scattered tensor)."""
        return self.ranks.index(dist.get_rank()) if self.size > 1 else 0

    @classmethod
    def from_mesh(cls, mesh: DeviceMesh, dims: tuple[str, ...]) -> GroupInfo:
        """The group of this rank over ``dims`` of ``mesh`` (several dims are flattened into one group)."""
        dims = tuple(dims)
        if not dims:
            return cls("", (dist.get_rank(),), None)
        sub = sub_mesh(mesh, dims) if len(dims) > 1 or mesh.mesh_dim_names != dims else mesh
        if len(dims) > 1:
            sub = sub._flatten("+".join(dims))
        ranks = tuple(int(r) for r in sub.mesh.flatten().tolist())
        group = sub.get_group() if len(ranks) > 1 else None
        return cls("+".join(dims), ranks, group)

    def __repr__(self) -> str:
        return f"GroupInfo(name={self.name!r}, ranks={list(self.ranks)}, size={self.size})"


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def release(buffer: torch.Tensor) -> None:
    """Free a communication buffer now that the synchronous collective using it has returned.

    The caller must hold the only view of ``buffer``: its storage is emptied. On CPU the collective is
    complete, but gloo's worker thread may still hold a reference to its tensors, so without this the
    memory would be freed on that thread, at a moment that varies from step to step (and out of sight
    of a profiler recording this thread). On CUDA the buffer may still be in use on the communication
    stream: there the reference is simply dropped and the caching allocator frees it when safe.
    """
    if buffer.device.type == "cpu":
        buffer.untyped_storage().resize_(0)


class PendingCollective:
    """A collective issued with ``async_op`` (or a batch of point-to-point ops): ``wait()`` blocks until
    it completed and records its trace events (issue to wait's return). On NCCL the work runs on its own
    stream and ``wait()`` orders the current stream after it; on gloo it runs on gloo's threads.

    ``works``: the works to wait for (a batch of P2P ops: one per op on gloo, one for the batch on NCCL);
    ``completed``: the trace callbacks (``trace.issued``) to call once all of them are done; ``finish``: the
    local part of a collective finished after its communication (gloo's reduce-scatter, ``gloo_sum``), run in
    ``wait()`` before its event ends; ``link_end``: its emulated end (``link.reserve``; None: no link), which
    ``wait()`` sleeps until and which counts for whether it was done before the wait."""

    def __init__(self, works: list, completed: list, finish=None, link_end: float | None = None) -> None:
        self._works = list(works)
        self._completed = [callback for callback in completed if callback is not None]  # None: nothing records
        self._finish = finish
        self._link_end = link_end

    def wait(self) -> None:
        if not self._works:
            return
        recorder = trace.current()
        t_wait = recorder.now() if recorder is not None else 0.0
        done_before_wait = link.is_done(self._link_end) and all(bool(work.is_completed()) for work in self._works)
        with trace.outside_compute():
            for work in self._works:
                work.wait()
            link.hold_until(self._link_end)
            if self._finish is not None:
                self._finish()
        for completed in self._completed:
            completed(t_wait, done_before_wait)
        self._works = []


def _all_gather_single():
    """torch 2.13's name (its old one warns), or the old one where the torch predates it (the CUDA images
    ``make gpu-smoke`` meets ship 2.11). Looked up per call, so a wrapper installed on ``dist`` sees it."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_single():
    """As ``_all_gather_single``, for reduce-scatter."""
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _chunk_field(chunk: int | None) -> dict[str, int]:
    return {} if chunk is None else {"chunk": chunk}


def _issue(
    op: str,
    info: GroupInfo,
    nbytes: int,
    dtype: torch.dtype,
    module: str | None,
    async_op: bool,
    call,
    finish=None,
    **fields,
) -> PendingCollective | None:
    """Run ``call(async_op)`` traced: synchronously, or issued now and recorded when waited for.
    ``finish()``, if given, completes the collective locally once its communication has landed; ``fields``
    are added to its trace event (e.g. the chunk of a pipelined collective)."""
    if not async_op:
        with trace.collective(op, info.name, info.ranks, nbytes, dtype, module, **fields):
            end = link.reserve(op, info.name, info.size, nbytes)
            call(False)
            link.hold_until(end)
            if finish is not None:
                finish()
        return None
    completed = trace.issued(op, info.name, info.ranks, nbytes, dtype, module, **fields)
    end = link.reserve(op, info.name, info.size, nbytes)
    with trace.outside_compute():
        work = call(True)
    return PendingCollective([work], [completed], finish, end)


def all_gather_into_tensor(
    output: torch.Tensor,
    shard: torch.Tensor,
    info: GroupInfo,
    module: str | None = None,
    async_op: bool = False,
    chunk: int | None = None,
) -> PendingCollective | None:
    """``output`` (size x shard, contiguous) <- every rank's ``shard`` in rank order of the group; ``chunk``:
    which piece of a pipelined collective this is (``parallel.async_tp``), recorded in its trace event."""
    if info.size == 1:
        output.copy_(shard.reshape(output.shape))
        return PendingCollective([], []) if async_op else None
    return _issue(
        "all_gather",
        info,
        _nbytes(output),
        output.dtype,
        module,
        async_op,
        lambda run_async: _all_gather_single()(output, shard, group=info.group, async_op=run_async),
        **_chunk_field(chunk),
    )


def reduce_scatter_tensor(
    output: torch.Tensor,
    full: torch.Tensor,
    info: GroupInfo,
    module: str | None = None,
    async_op: bool = False,
    chunk: int | None = None,
) -> PendingCollective | None:
    """``output`` <- this rank's 1/size of the sum of every rank's ``full`` (``chunk`` as for the all-gather).

    On gloo, an all-to-all of the chunks and a local sum in gloo's order (``hyper_parallel.gloo_sum``): the
    ring bound on the wire instead of gloo's all-reduce, the same bits."""
    if info.size == 1:
        output.copy_(full.reshape(output.shape))
        return PendingCollective([], []) if async_op else None
    if uses_gloo(full, info.group):
        direct = DirectReduceScatter(output, full, info.size, info.index, info.group)
        call, finish = direct.start, direct.finish
    else:

        def call(run_async: bool):
            return _reduce_scatter_single()(output, full, op=dist.ReduceOp.SUM, group=info.group, async_op=run_async)

        finish = None
    return _issue(
        "reduce_scatter", info, _nbytes(full), full.dtype, module, async_op, call, finish, **_chunk_field(chunk)
    )


def all_reduce(
    tensor: torch.Tensor, info: GroupInfo, module: str | None = None, async_op: bool = False
) -> torch.Tensor | PendingCollective:
    """In-place sum over the group; with ``async_op`` the pending collective instead of the tensor."""
    if info.size == 1:
        return PendingCollective([], []) if async_op else tensor
    pending = _issue(
        "all_reduce",
        info,
        _nbytes(tensor),
        tensor.dtype,
        module,
        async_op,
        lambda run_async: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=info.group, async_op=run_async),
    )
    return pending if async_op else tensor


def all_to_all_single(
    output: torch.Tensor,
    tensor: torch.Tensor,
    info: GroupInfo,
    output_splits: list[int] | None = None,
    input_splits: list[int] | None = None,
    module: str | None = None,
) -> torch.Tensor:
    """Rank i sends ``input_splits[j]`` rows to rank j and receives ``output_splits[j]`` rows from it."""
    if info.size == 1:
        output.copy_(tensor)
        return output
    with trace.collective("all_to_all", info.name, info.ranks, _nbytes(tensor), tensor.dtype, module):
        end = link.reserve("all_to_all", info.name, info.size, _nbytes(tensor))
        dist.all_to_all_single(
            output, tensor, output_split_sizes=output_splits, input_split_sizes=input_splits, group=info.group
        )
        link.hold_until(end)
    return output


def ring_exchange(
    send: torch.Tensor, recv: torch.Tensor, info: GroupInfo, direction: int, module: str | None = None, tag: int = 0
) -> PendingCollective:
    """One step of a ring, asynchronous: ``send`` to the group's rank ``index + direction`` and ``recv``
    from rank ``index - direction`` (indices mod the group size), posted together as one batch of P2P
    ops (``batch_isend_irecv``: NCCL runs it as one group, gloo as an isend and an irecv). Returns at
    once; ``wait()`` blocks until both are done and records a ``send`` and a ``recv`` event on the group
    (bytes: what this rank sends / receives; ``peer``: the other rank; issue to wait's return).

    Every rank of the group must call it with the same ``direction`` and ``tag`` (the tag keeps two
    exchanges in flight to the same peer apart on gloo; NCCL matches them in the order posted)."""
    if info.size == 1:
        raise ValueError(f"a ring needs at least 2 ranks; group {info.name} has 1 (exchange with yourself: copy)")
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 (to the next rank) or -1 (to the previous), got {direction!r}")
    index = info.index
    to, source = info.ranks[(index + direction) % info.size], info.ranks[(index - direction) % info.size]
    me = info.ranks[index]
    completed = [
        trace.issued(op, info.name, sorted({me, peer}), _nbytes(tensor), tensor.dtype, module, peer=peer)
        for op, peer, tensor in (("send", to, send), ("recv", source, recv))
    ]
    ops = [
        dist.P2POp(dist.isend, send, to, group=info.group, tag=tag),
        dist.P2POp(dist.irecv, recv, source, group=info.group, tag=tag),
    ]
    # both directions travel at once (full duplex): the exchange takes as long as its larger message
    end = link.reserve("send", info.name, info.size, max(_nbytes(send), _nbytes(recv)))
    with trace.outside_compute():
        works = dist.batch_isend_irecv(ops)
    return PendingCollective(works, completed, link_end=end)


def broadcast(tensor: torch.Tensor, info: GroupInfo, src_index: int = 0, module: str | None = None) -> torch.Tensor:
    """In place: every rank gets the tensor of the group's ``src_index``-th rank."""
    if info.size > 1:
        with trace.collective("broadcast", info.name, info.ranks, _nbytes(tensor), tensor.dtype, module):
            end = link.reserve("broadcast", info.name, info.size, _nbytes(tensor))
            dist.broadcast(tensor, src=info.ranks[src_index], group=info.group)
            link.hold_until(end)
    return tensor
