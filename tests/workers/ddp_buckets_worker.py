"""Every rank runs notebook 01's DDP bucket probe and writes what it found to
``$HYPER_PARALLEL_RUN_DIR/ddp_buckets_rank<r>.json`` (read by tests/test_ddp_lesson.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist

from hyper_parallel.benchmark.ddp_buckets import ddp_bucket_probe

if __name__ == "__main__":
    dist.init_process_group("gloo")
    found = ddp_bucket_probe()
    path = Path(os.environ["HYPER_PARALLEL_RUN_DIR"]) / f"ddp_buckets_rank{dist.get_rank()}.json"
    path.write_text(json.dumps(found))
    dist.destroy_process_group()
