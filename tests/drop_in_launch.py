"""The one 4-rank launch of tests/workers/drop_in_worker.py that a drop-in test module shares, and reading
one case's result from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.processes.supervisor import torchrun

WORKER = Path(__file__).parent / "workers" / "drop_in_worker.py"


def launch_cases(out: Path, *args: str) -> list[dict]:
    """Every rank's results of the cases the worker runs with ``args`` (e.g. ``--modules NAME``)."""
    run = torchrun(str(WORKER), 4, args=["--out", str(out), *args], timeout=900, run_dir=out)
    if not run.ok:
        pytest.fail(f"4-rank launch failed:\n{run.error}", pytrace=False)
    return [json.loads((out / f"drop_in_rank{r}.json").read_text()) for r in range(4)]


def case_result(results: list[dict], name: str) -> dict:
    """Rank 0's result of ``name``; fails with the traceback of any rank on which the case raised."""
    for rank, per_rank in enumerate(results):
        assert "error" not in per_rank[name], f"rank {rank}:\n{per_rank[name]['error']}"
    return results[0][name]
