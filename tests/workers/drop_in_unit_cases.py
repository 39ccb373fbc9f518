"""Drop-in cases about fully_shard units and when they reshard, over 4 ranks: activation checkpointing,
reshard_after_forward False and 2 (backward gathers over a pair, from the kept half), several modules
as one unit, and torch's ``common_fsdp.MLP`` as a model of other modules; each trained by ours, by torch
FSDP2 and by one process on the global batch (checked by tests/test_drop_in.py: bit-equal to torch FSDP2,
close to the single-process reference, and the all-gather groups and bytes against counts derived by hand).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from drop_in_training import (
    case,
    fsdp_only,
    lm_loss,
    run_three,
    shard_per_block,
    tokens,
    transformer,
    world_mesh,
)
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.testing._internal.common_fsdp import MLP

from hyper_parallel import trace
from hyper_parallel.fsdp import fully_shard as our_fully_shard


@case
def activation_checkpointing():
    return run_three(
        lambda: transformer(weight_tying=False, checkpoint_activations=True),
        fsdp_only(world_mesh()),
        dist.get_rank(),
        4,
    )


@case
def keep_after_forward():
    return run_three(
        lambda: transformer(weight_tying=False),
        fsdp_only(world_mesh(), reshard_after_forward=False),
        dist.get_rank(),
        4,
    )


@case
def reshard_to_two_after_forward():
    """reshard_after_forward=2 on fsdp 4: backward all-gathers over 2 ranks, from the kept half."""
    result = run_three(
        lambda: transformer(weight_tying=False), fsdp_only(world_mesh(), reshard_after_forward=2), dist.get_rank(), 4
    )
    model = transformer(weight_tying=False)
    shard_per_block(model, our_fully_shard, world_mesh(), reshard_after_forward=2)
    _, local = tokens(dist.get_rank(), 4)
    with trace.record() as recorder:
        lm_loss(model, local).backward()
    result["facts"] = {
        "all_gathers": sorted(
            (e["phase"], e["module"], e["ranks"], e["bytes"])
            for e in recorder.events
            if e["kind"] == "collective" and e["op"] == "all_gather"
        )
    }
    return result


@case
def modules_as_one_unit():
    """fully_shard([norm, output]) as one unit (chunked-loss style), then the blocks and the root."""

    def with_(shard):
        def apply(model):
            shard([model.norm, model.output], mesh=world_mesh())
            shard_per_block(model, shard, world_mesh())
            return model

        return apply

    return run_three(
        lambda: transformer(weight_tying=False),
        {"torch": with_(torch_fully_shard), "ours": with_(our_fully_shard)},
        dist.get_rank(),
        4,
    )


@case
def common_fsdp_mlp():
    def build():
        torch.manual_seed(0)
        return nn.Sequential(MLP(16), MLP(16, dim_multiplier=3), nn.Linear(16, 32))

    def with_(shard):
        def apply(model):
            for sub in model[:2]:
                shard(sub, mesh=world_mesh())
            shard(model, mesh=world_mesh())
            return model

        return apply

    return run_three(
        build,
        {"torch": with_(torch_fully_shard), "ours": with_(our_fully_shard)},
        dist.get_rank(),
        4,
        loss_fn=one_hot_loss,
    )


def one_hot_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """lm_loss for a model of 16 features: tokens one-hot encoded (mod 16) in, next-token cross-entropy out."""
    return F.cross_entropy(model(F.one_hot(batch[:, :-1] % 16, 16).float()).flatten(0, 1), batch[:, 1:].flatten())
