"""The extended fully_shard, laid out like torch.distributed.fsdp._fully_shard:
api (entry point) / module (the methods a managed module gains) / roles (mesh dims) / param (one
layout per parameter) / param_group (bucketed collectives) / state (forward and backward hooks)."""

from hyper_parallel.comm import GroupInfo
from hyper_parallel.fsdp.api import fully_shard
from hyper_parallel.fsdp.module import FullyShardModule, UnshardHandle
from hyper_parallel.fsdp.param import ShardedParam
from hyper_parallel.fsdp.param_group import MixedPrecisionPolicy
from hyper_parallel.partial_grad import PARTIAL_GRAD_ATTR

__all__ = [
    "fully_shard",
    "FullyShardModule",
    "UnshardHandle",
    "MixedPrecisionPolicy",
    "GroupInfo",
    "ShardedParam",
    "PARTIAL_GRAD_ATTR",
]
