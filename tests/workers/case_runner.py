"""The loop a case worker runs after ``init_process_group``: every selected case on every rank, a raising case
recorded with its traceback (the test reports it), the ranks meeting at a barrier after each case, and
the results written as one JSON file per rank."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist


def run_cases(cases: dict[str, Callable[[], dict]], selected: str, out_file: Path) -> None:
    """``selected``: "all" or comma-separated names; then the process group is destroyed."""
    names = list(cases) if selected == "all" else selected.split(",")
    results = {}
    for name in names:
        try:
            results[name] = cases[name]()
        except Exception:  # recorded: the test reports the traceback of the failing case
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    out_file.write_text(json.dumps(results, indent=1, default=str))
    dist.barrier()
    dist.destroy_process_group()
