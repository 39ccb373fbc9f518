"""Pipeline recipes (P1, P2): the transformer cut into pp stages, TP and our fully_shard applied per stage,
trained by a torch.distributed.pipelining schedule next to the single-process reference.

A schedule's ``step`` is forward and backward of every microbatch at once, so the workload's model is a
``PipelineStep`` module: calling it runs one whole training step (schedule, then SGD on this rank's
stages) and returns the loss of this rank's pipeline; the generic trainer's ``backward`` and optimizer
then have nothing left to do (no parameter has a gradient). The parameters of the stages other ranks
hold are mirrored on rank 0 after every step, so the trainer compares every parameter with the
reference by name; that copy, like the loss broadcast, is bookkeeping outside the trace.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import _disable_current_modes

from hyper_parallel import trace
from hyper_parallel.devices import seeded_on_host
from hyper_parallel.fsdp import fully_shard
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.mesh_dims import MeshDim
from hyper_parallel.mesh_views import MeshViews
from hyper_parallel.models.transformer import Transformer, TransformerConfig, lm_loss, token_batch
from hyper_parallel.parallel.pipeline import (
    PLACEMENTS,
    TracedPipelineStage,
    build_schedule,
    split_transformer,
    stage_indices,
)
from hyper_parallel.parallel.tp import parallelize_transformer_tp
from hyper_parallel.recipes.batches import data_parallel_rows
from hyper_parallel.recipes.options import RunOptions
from hyper_parallel.recipes.training import Workload

PIPELINE_CONFIG = TransformerConfig(n_layers=4)  # 4 layers: 2 stages of 2, or 4 stages of 1 (interleaved)
ZERO_BUBBLE_CONFIG = TransformerConfig(n_layers=8)  # 2 stages per rank: 4 stages of 2 on pp 2, 8 of 1 on pp 4
PIPELINE_MOE_CONFIG = TransformerConfig(
    n_layers=4, moe_layers=(1, 3), num_experts=4, top_k=2, moe_hidden=32, shared_expert=True
)  # one MoE layer in each of 2 stages
LR = 0.5


class PipelineStep(nn.Module):
    """One pipeline training step per call; the parameters keep the full model's names.

    Submodules are registered under the Transformer's own names (``tok_embeddings``, ``layers.<i>``,
    ``norm``, ``output``): this rank's stages, and on rank 0 frozen mirrors of the other stages.
    """

    def __init__(
        self,
        stages,
        schedule,
        dims: ParallelDims,
        views: MeshViews,
        mirror_of: Transformer | None,
        owners: dict[str, int],
        lr: float,
        loss_pp_rank: int,
    ) -> None:
        """``mirror_of`` (rank 0 only): a copy of the unparallelized model, ``owners``: full parameter name ->
        the rank of rank 0's data slice that holds it (``_owners``); ``loss_pp_rank``: the pp rank that runs
        the last stage (the last one, or the first under the V placement)."""
        super().__init__()
        self.owners = owners
        self.layers = nn.ModuleDict()
        for _, module in stages:
            for name in ("tok_embeddings", "norm", "output"):
                if getattr(module, name) is not None:
                    self.add_module(name, getattr(module, name))
            self.layers.update(module.layers)
        self.owned = {name for name, _ in self.named_parameters()}
        self.stage_modules = nn.ModuleList(module for _, module in stages)  # fully_shard roots, for summaries
        self.schedule = schedule
        self.is_last = any(module.last for _, module in stages)
        self.is_first = any(module.first for _, module in stages)
        self.optimizer = torch.optim.SGD([p for p in self.parameters()], lr=lr)
        self.pp_group = views[MeshDim.PP].get_group()
        self.device = views.device
        pp_ranks = dims.group_of(MeshDim.PP, dist.get_rank())
        self.loss_rank = pp_ranks[loss_pp_rank]  # the rank of this pp group that runs the last stage
        self.rank0_partners = dims.group_of(MeshDim.PP, 0)  # rank 0 and the ranks of its data slice in later stages
        if mirror_of is not None:  # rank 0: frozen copies of every parameter it does not hold
            for name, module in mirror_of.named_children():
                if name == "layers":
                    for index, layer in enumerate(module):
                        if str(index) not in self.layers:
                            self.layers[str(index)] = layer.requires_grad_(False)
                elif not hasattr(self, name) or getattr(self, name) is None:
                    self.add_module(name, module.requires_grad_(False))
        self.full_names = sorted(name for name, _ in mirror_of.named_parameters()) if mirror_of is not None else []

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        self.schedule.step(
            *((tokens,) if self.is_first else ()), **({"target": targets, "losses": losses} if self.is_last else {})
        )
        with trace.labels(phase="optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad()
        with _disable_current_modes():  # bookkeeping: not the training's communication
            loss = torch.stack(losses).mean().detach() if self.is_last else torch.zeros((), device=self.device)
            dist.broadcast(loss, src=self.loss_rank, group=self.pp_group)
            self._refresh_mirrors()
        return loss.requires_grad_()

    def _refresh_mirrors(self) -> None:
        """Rank 0 receives the updated full parameters of the stages it does not hold."""
        rank = dist.get_rank()
        params = dict(self.named_parameters())
        # every rank gathers its own stages' parameters in the same order (full_tensor is a collective of
        # the stage's fsdp/tp groups); the ranks of rank 0's data slice in later stages send theirs to it
        fulls = {
            name: params[name].full_tensor() if isinstance(params[name], DTensor) else params[name].detach()
            for name in sorted(self.owned)
        }
        if rank == 0:
            for name in self.full_names:
                if name not in self.owned:
                    dist.recv(params[name].data, src=self.owners[name])
        elif rank in self.rank0_partners:
            for name in sorted(self.owned):
                dist.send(fulls[name].contiguous(), dst=0)


def step_or_lm_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss the trainer asks for: a PipelineStep already returns it (a scalar), the reference's
    logits go through the language-model loss."""
    return output if output.dim() == 0 else lm_loss(output, targets)


def _owners(config: TransformerConfig, dims: ParallelDims, stages_per_rank: int, placement: str) -> dict[str, int]:
    """Full parameter name -> the rank of rank 0's data slice whose stage holds it."""
    with torch.device("meta"):  # the names only: no storage, no random draws
        model = Transformer(config)
    owners = {}
    partners = dims.group_of(MeshDim.PP, 0)
    for pp_rank, rank in enumerate(partners):
        for _, stage in split_transformer(model, dims.pp, pp_rank, stages_per_rank, placement):
            for name, _ in stage.named_parameters():
                owners[name] = rank
    return owners


def pipeline_workload(
    dims: ParallelDims,
    views: MeshViews,
    seed: int,
    options: RunOptions,
    schedule: str,
    stages_per_rank: int = 1,
    config: TransformerConfig = PIPELINE_CONFIG,
) -> Workload:
    """TP (without SP) on the whole model, EP on its MoE layers, then the cut into this rank's stages and
    fully_shard per stage: each layer a unit (a MoE's experts one more, on the sparse view), the stage
    module the root (holding the embedding or the head, if any), so that torch's schedule sees an FSDPModule
    and turns gradient sync off until the step's last microbatch. ``options``: the global batch, split into
    ``options.microbatches`` per data-parallel rank, the sequence length and (P3) the experts.

    No unit reshards after forward (torchtitan's default under PP): torch's schedule keeps every unit
    gathered after its first backward until the step's end anyway (resharding after backward is off until
    the last microbatch), so resharding after each forward would only re-gather the unit for the next
    microbatch, up to twice per microbatch, and save memory only until the first backward. A run can
    still trade the memory back with ``set_reshard_after_forward(True)`` on the units."""
    config = dataclasses.replace(config, seq_len=options.seq_len, num_experts=options.num_experts or config.num_experts)
    with seeded_on_host(seed):
        model = Transformer(config)
    reference = copy.deepcopy(model)
    rank = dist.get_rank()
    parallelize_transformer_tp(model, views[MeshDim.TP], sequence_parallel=False)
    if dims.ep > 1:
        from hyper_parallel.recipes.moe import apply_expert_parallel

        apply_expert_parallel(model, dims, views, dispatch="all_to_all")
    placement = PLACEMENTS[schedule]
    stages = split_transformer(model, dims.pp, dims.coordinates(rank)[MeshDim.PP], stages_per_rank, placement)
    shard_stages(stages, dims, views)
    microbatches = options.microbatches
    tokens, targets = token_batch(config, options.global_batch, seed)
    local_tokens, local_targets = data_parallel_rows(tokens, dims), data_parallel_rows(targets, dims)
    rows = local_tokens.shape[0] // microbatches
    device = views.device
    hidden = torch.zeros(rows, config.seq_len, config.d_model, device=device, requires_grad=True)  # gradient goes back
    pipeline_stages = _traced_stages(stages, dims.pp * stages_per_rank, local_tokens[:rows], hidden, config, views)
    step = PipelineStep(
        stages,
        build_schedule(schedule, pipeline_stages, microbatches, lm_loss),
        dims,
        views,
        mirror_of=copy.deepcopy(reference).to(device) if rank == 0 else None,
        owners=_owners(config, dims, stages_per_rank, placement) if rank == 0 else {},
        lr=LR,
        loss_pp_rank=_last_stage_pp_rank(dims.pp, stages_per_rank, placement),
    )
    return Workload(
        step,
        reference,
        (local_tokens, local_targets),
        local_targets,
        (tokens,),
        targets,
        loss_fn=step_or_lm_loss,
        lr=LR,
        notes={
            "schedule": schedule,
            "microbatches": microbatches,
            "stages_per_rank": stages_per_rank,
            "boundary_bytes": hidden.numel() * hidden.element_size(),
        },
    )


def shard_stages(stages, dims: ParallelDims, views: MeshViews) -> None:
    """fully_shard per stage: each layer a unit (a MoE's experts one more, on the sparse view), the stage module
    the root, so that torch's schedule sees an FSDPModule and reduces once per step; none reshards after
    forward (see ``pipeline_workload``)."""
    fsdp_mesh = views[MeshDim.DP_REPLICATE, MeshDim.FSDP]
    for _, stage in stages:
        for layer in stage.layers.values():
            if dims.ep > 1 and hasattr(layer.feed_forward, "experts"):
                experts = fully_shard(
                    layer.feed_forward.experts,
                    mesh=views[MeshDim.DP_REPLICATE, MeshDim.EFSDP],
                    reshard_after_forward=False,
                )
                experts.set_gradient_divide_factor(dims.dp_cp)
            fully_shard(layer, mesh=fsdp_mesh, reshard_after_forward=False)
        fully_shard(stage, mesh=fsdp_mesh, reshard_after_forward=False)


def _traced_stages(
    stages, num_stages: int, first_rows: torch.Tensor, hidden: torch.Tensor, config: TransformerConfig, views
) -> list[TracedPipelineStage]:
    """This rank's stages as torch's pipelining stages: the first takes a microbatch of tokens, the last gives
    logits, the others pass a hidden state of ``hidden``'s shape (which torch reads to allocate its buffers)."""
    device, rows, pp_group = views.device, first_rows.shape[0], views[MeshDim.PP].get_group()
    return [
        TracedPipelineStage(
            stage,
            index,
            num_stages,
            device,
            input_args=first_rows.to(device) if stage.first else hidden,
            output_args=torch.zeros(rows, config.seq_len, config.vocab_size, device=device) if stage.last else hidden,
            group=pp_group,
        )
        for index, stage in stages
    ]


def _last_stage_pp_rank(pp: int, stages_per_rank: int, placement) -> int:
    """The pp rank that runs the model's last stage, whose loss the step reports (rank pp-1 when stages loop,
    rank 0 under the V placement)."""
    return next(r for r in range(pp) if pp * stages_per_rank - 1 in stage_indices(pp, r, stages_per_rank, placement))


def gpipe(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """P1-G: all forwards, then all backwards (fill-drain)."""
    return pipeline_workload(dims, views, seed, options, "gpipe")


def one_f_one_b(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """P1, P2: one forward, one backward in the steady state (fewer activations alive than GPipe)."""
    return pipeline_workload(dims, views, seed, options, "1f1b")


def interleaved(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """P1-I: 2 stages per rank (looped placement), interleaved 1F1B."""
    return pipeline_workload(dims, views, seed, options, "interleaved_1f1b", stages_per_rank=2)


def expert_parallel(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """P3: 1F1B over stages that each hold one MoE layer with its experts spread over ep."""
    return pipeline_workload(dims, views, seed, options, "1f1b", config=PIPELINE_MOE_CONFIG)


def zero_bubble(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """P4: ZB-V, 2 stages per rank in a V; each backward split into B and W, the W filling idle time."""
    return pipeline_workload(dims, views, seed, options, "zbv", stages_per_rank=2, config=ZERO_BUBBLE_CONFIG)


def dual_pipe_v(dims: ParallelDims, views: MeshViews, seed: int, options: RunOptions) -> Workload:
    """P5: DualPipeV, 2 stages per rank in a V; forwards and backwards of two stages paired, B/W split."""
    return pipeline_workload(dims, views, seed, options, "dualpipev", stages_per_rank=2, config=ZERO_BUBBLE_CONFIG)
