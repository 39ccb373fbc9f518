"""Every rank runs notebook 07's torch.compile lesson and writes what it found to
``$HYPER_PARALLEL_RUN_DIR/compile_rank<r>.json`` (read by tests/test_compile_lesson.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist

from hyper_parallel.benchmark.compile_probe import compile_probe

if __name__ == "__main__":
    dist.init_process_group("gloo")
    found = compile_probe()
    (Path(os.environ["HYPER_PARALLEL_RUN_DIR"]) / f"compile_rank{dist.get_rank()}.json").write_text(json.dumps(found))
    dist.destroy_process_group()
