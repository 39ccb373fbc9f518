"""Expert parallelism for ``hyper_parallel.models.moe.MoE``: ``parallelize_moe`` (``parallelize``) with an
all-to-all token exchange (``all_to_all``, the default) or Megatron's all-gather dispatcher (``all_gather``)."""

from hyper_parallel.parallel.ep.all_to_all import ExpertParallelExperts, exchange_counts, expert_major_order
from hyper_parallel.parallel.ep.parallelize import parallelize_moe

__all__ = ["parallelize_moe", "ExpertParallelExperts", "exchange_counts", "expert_major_order"]
