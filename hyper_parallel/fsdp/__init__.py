"""The extended fully_shard, laid out like torch.distributed.fsdp._fully_shard:
api (entry point) / layouts (which parameters, where) / roles (mesh dims) / param (one layout per parameter) /
param_group (one flat buffer per dtype: gather, reshard) / reduction (a group's reducer: what is reduced, sums
across micro-steps, the reduction in flight) / step (training states, per-unit progress) / state (the hooks of
one step) / module (torch's FSDPModule surface) / torch_interop (what torch's pipelining reads) / state_dict /
grad_norm (clip_grad_norm_ over gradients on several meshes)."""

from hyper_parallel.comm import GroupInfo
from hyper_parallel.fsdp.api import fully_shard
from hyper_parallel.fsdp.grad_norm import clip_grad_norm_
from hyper_parallel.fsdp.module import FullyShardModule, UnshardHandle
from hyper_parallel.fsdp.param import ShardedParam
from hyper_parallel.fsdp.param_group import MixedPrecisionPolicy
from hyper_parallel.partial_grad import PARTIAL_GRAD_ATTR

__all__ = [
    "fully_shard",
    "clip_grad_norm_",
    "FullyShardModule",
    "UnshardHandle",
    "MixedPrecisionPolicy",
    "GroupInfo",
    "ShardedParam",
    "PARTIAL_GRAD_ATTR",
]
