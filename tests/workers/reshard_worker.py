"""Every rank runs notebook 05's resharding lesson (save on FSDP 4, load on HSDP 2 x 2) and writes what it found to
``$HYPER_PARALLEL_RUN_DIR/reshard_rank<r>.json`` (read by tests/test_reshard_lesson.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist

from hyper_parallel.benchmark.reshard_probe import reshard_probe

if __name__ == "__main__":
    dist.init_process_group("gloo")
    run_dir = Path(os.environ["HYPER_PARALLEL_RUN_DIR"])
    found = reshard_probe(str(run_dir / "checkpoint"))
    (run_dir / f"reshard_rank{dist.get_rank()}.json").write_text(json.dumps(found))
    dist.destroy_process_group()
