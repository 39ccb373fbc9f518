"""The extended fully_shard of the RFC (DESIGN.md §4), laid out like torch.distributed.fsdp._fully_shard:
api (entry point, module methods) / roles (mesh dims) / param (one layout per parameter) /
param_group (bucketed collectives) / state (forward and backward hooks)."""
from hyper_parallel.comm import GroupInfo
from hyper_parallel.fsdp.api import FullyShardModule, fully_shard
from hyper_parallel.fsdp.param import PARTIAL_GRAD_ATTR, ShardedParam
from hyper_parallel.fsdp.param_group import MixedPrecisionPolicy

__all__ = ["fully_shard", "FullyShardModule", "MixedPrecisionPolicy", "GroupInfo", "ShardedParam", "PARTIAL_GRAD_ATTR"]
