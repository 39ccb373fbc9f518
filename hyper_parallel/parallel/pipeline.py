"""Pipeline parallelism on torch.distributed.pipelining: the transformer cut into stages by layers, and a
PipelineStage that records each microbatch's forward/backward and every P2P send/receive in the trace.

Stage s of ``pp * stages_per_rank`` holds layers [s*L/S, (s+1)*L/S); the first also the embedding, the last
the final norm and the head. Stage modules keep the full model's parameter names (``layers.3.attention.wq
.weight``) so a stage compares with the single-process reference by name. Which stages a rank runs is the
schedule's placement (``PLACEMENTS``): "loop" gives rank r the stages r, r + pp, ... (interleaved 1F1B);
"v" gives it stages r and 2 pp - 1 - r (the zero-bubble ZB-V and DualPipeV schedules: the microbatch goes
down the ranks and comes back up, so rank pp - 1 holds two neighbouring stages and rank 0 the first and
the last).

The schedules: ``gpipe``, ``1f1b`` and ``interleaved_1f1b`` run a microbatch's backward as one action;
``zbv`` (ZB-V, Qi et al. 2023) and ``dualpipev`` (DeepSeek-V3's DualPipe cut in half) split it into the
input gradient (B, which the previous stage waits for) and the weight gradient (W, which only the optimizer
needs), and place the W actions in what would otherwise be idle time.

Our fully_shard module is an ``FSDPModule`` to torch, so the schedules turn gradient sync and resharding
after backward off for every microbatch and reduce once, after the step's last backward.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)

from hyper_parallel import trace
from hyper_parallel.fsdp.summary import gathered_bytes
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.models.transformer import Transformer

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}
PLACEMENTS = {"gpipe": "loop", "1f1b": "loop", "interleaved_1f1b": "loop", "zbv": "v", "dualpipev": "v"}
"""Which stages a rank runs under each schedule (module docstring)."""
MULTI_STAGE = {"interleaved_1f1b": None, "zbv": 2, "dualpipev": 2}
"""Schedules that run several stages per rank: how many they need (None: any number from 2)."""


class TransformerStage(nn.Module):
    """Consecutive layers of a Transformer (and the embedding / the head when first / last)."""

    def __init__(self, model: Transformer, layer_ids: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layer_ids})
        self.norm = model.norm if last else None
        self.output = model.output if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: tokens [batch, seq] on the first stage, hidden states [batch, seq, d_model] elsewhere."""
        h = self.tok_embeddings(x) if self.first else x
        positions = torch.arange(h.shape[1], device=h.device)
        for layer in self.layers.values():
            h = layer(h, positions)
        return self.output(self.norm(h)) if self.last else h


def stage_indices(pp: int, pp_rank: int, stages_per_rank: int, placement: str = "loop") -> list[int]:
    """The stages of pipeline rank ``pp_rank``: one per round of pp stages ("loop"), or down and back up
    ("v": stages pp_rank and 2 pp - 1 - pp_rank)."""
    if placement == "v":
        if stages_per_rank != 2:
            raise ValueError(f"the V placement runs exactly 2 stages per rank, got stages_per_rank={stages_per_rank}")
        return [pp_rank, 2 * pp - 1 - pp_rank]
    if placement != "loop":
        raise ValueError(f"placement must be 'loop' or 'v', got {placement!r}")
    return [pp_rank + round_ * pp for round_ in range(stages_per_rank)]


def split_transformer(
    model: Transformer, pp: int, pp_rank: int, stages_per_rank: int = 1, placement: str = "loop"
) -> list[tuple[int, TransformerStage]]:
    """(stage index, stage module) for each stage of ``pp_rank``, in the order the rank holds them."""
    n_stages = pp * stages_per_rank
    n_layers = model.config.n_layers
    if n_layers % n_stages:
        raise ValueError(f"n_layers={n_layers} must be divisible by the {n_stages} pipeline stages")
    per_stage = n_layers // n_stages
    return [
        (s, TransformerStage(model, range(s * per_stage, (s + 1) * per_stage), s == 0, s == n_stages - 1))
        for s in stage_indices(pp, pp_rank, stages_per_rank, placement)
    ]


def _nbytes(ops: list[dist.P2POp]) -> int:
    return sum(op.tensor.numel() * op.tensor.element_size() for op in ops)


class TracedPipelineStage(PipelineStage):
    """A PipelineStage whose schedule actions appear in the trace.

    Events (besides those fully_shard records): ``{"kind": "pipeline", "action", "phase", "stage",
    "microbatch", "gathered_bytes", "t_start", "t_end"}`` around each microbatch's computation, with
    ``action`` "forward", "backward" (input and weight gradients at once), or, for the zero-bubble schedules
    that split it, "backward_input" (B: the gradient the previous stage waits for) and "backward_weight"
    (W: the parameters' gradients, free to fill an idle slot); ``gathered_bytes``: the parameters this
    stage's fully_shard units hold all-gathered when the action ends. One ``{"kind": "collective", "op":
    "send"|"recv", "group": "pp", "bytes", "peer", "microbatch"}`` per P2P batch this stage posts
    (activations forward, their gradients backward). A P2P is recorded when it is posted (zero duration):
    the schedule waits for it later, and the wait shows as the gap before the next action.
    """

    @contextlib.contextmanager
    def _action(self, action: str, microbatch: int):
        phase = "forward" if action == "forward" else "backward"
        with (
            trace.span("pipeline", action=action, phase=phase, stage=self.stage_index, microbatch=microbatch) as late,
            trace.labels(phase=phase, module=f"stage{self.stage_index}"),
        ):
            yield
            late["gathered_bytes"] = gathered_bytes(self.submod)

    def _p2p(self, op: str, phase: str, microbatch: int, ops: list[dist.P2POp]) -> list[dist.P2POp]:
        if ops:
            peers = [op_.peer for op_ in ops]  # P2POp.peer is the global rank
            trace.p2p(
                op,
                peers,
                _nbytes(ops),
                ops[0].tensor.dtype,
                group=MeshDim.PP,
                phase=phase,
                module=f"stage{self.stage_index}",
                microbatch=microbatch,
            )
        return ops

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        with self._action("forward", fwd_chunk_id):
            return super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        with self._action("backward" if full_backward else "backward_input", bwd_chunk_id):
            return super().backward_one_chunk(
                bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward
            )

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        with self._action("backward_weight", bwd_chunk_id):
            return super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)

    def get_fwd_send_ops(self, fwd_chunk_id):
        return self._p2p("send", "forward", fwd_chunk_id, super().get_fwd_send_ops(fwd_chunk_id))

    def get_fwd_recv_ops(self, fwd_chunk_id):
        return self._p2p("recv", "forward", fwd_chunk_id, super().get_fwd_recv_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id):
        return self._p2p("send", "backward", bwd_chunk_id, super().get_bwd_send_ops(bwd_chunk_id))

    def get_bwd_recv_ops(self, bwd_chunk_id):
        return self._p2p("recv", "backward", bwd_chunk_id, super().get_bwd_recv_ops(bwd_chunk_id))


def build_schedule(schedule: str, stages: list[PipelineStage], microbatches: int, loss_fn):
    """The torch schedule named ``schedule`` over this rank's stages (``MULTI_STAGE``: how many it needs)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; one of {sorted(SCHEDULES)}")
    if schedule in MULTI_STAGE:
        wanted = MULTI_STAGE[schedule]
        if len(stages) < 2 or (wanted is not None and len(stages) != wanted):
            raise ValueError(f"schedule {schedule!r} runs {wanted or 'at least 2'} stages per rank, got {len(stages)}")
        return SCHEDULES[schedule](stages, n_microbatches=microbatches, loss_fn=loss_fn)
    if len(stages) != 1:
        raise ValueError(
            f"schedule {schedule!r} runs one stage per rank, got {len(stages)}; "
            f"schedules for several stages per rank: {sorted(MULTI_STAGE)}"
        )
    return SCHEDULES[schedule](stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
