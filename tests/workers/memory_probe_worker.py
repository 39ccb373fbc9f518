"""Every rank runs the memory probe of 02_memory in each configuration and writes its numbers to
``$HYPER_PARALLEL_RUN_DIR/memory_rank<r>.json`` (read by tests/test_memory_lesson.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist

from hyper_parallel.benchmark.memory_probe import memory_probe

CONFIGURATIONS = {
    "default": {},
    "no reshard": {"reshard_after_forward": False},
    "checkpointed": {"checkpointed": True},
    "2 micro-batches": {"micro_batches": 2},
    "2 micro-batches, one sync": {"micro_batches": 2, "sync_last_micro_batch_only": True},
}

if __name__ == "__main__":
    dist.init_process_group("gloo")
    found = {name: memory_probe(**options) for name, options in CONFIGURATIONS.items()}
    path = Path(os.environ["HYPER_PARALLEL_RUN_DIR"]) / f"memory_rank{dist.get_rank()}.json"
    path.write_text(json.dumps(found))
    dist.destroy_process_group()
