"""A test worker under torchrun, read back: ``tests/workers/<worker>.py`` on ``world_size`` gloo ranks, each
rank writing ``<prefix>_rank<r>.json`` into the run directory (``HYPER_PARALLEL_RUN_DIR``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"


def run_worker(worker: str, world_size: int, run_dir: Path, prefix: str, timeout: float) -> list[dict]:
    """Every rank's JSON, in rank order; a failed launch fails the test with torchrun's error."""
    from launch.processes.supervisor import torchrun

    result = torchrun(str(WORKERS / f"{worker}.py"), world_size, timeout=timeout, run_dir=run_dir)
    if not result.ok:
        pytest.fail(f"{worker} on {world_size} ranks failed:\n{result.error}", pytrace=False)
    return [json.loads((run_dir / f"{prefix}_rank{rank}.json").read_text()) for rank in range(world_size)]
