"""The 4-rank launches of tests/workers/drop_in_worker.py that drop-in test modules share, and reading one
case's result from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.processes.supervisor import torchrun

WORKER = Path(__file__).parent / "workers" / "drop_in_worker.py"


STACKS_AND_FSDP2_SUITE = ("drop_in_stack_cases", "drop_in_fsdp2_param_cases", "drop_in_fsdp2_unit_cases")
"""The case modules of the launch tests/test_drop_in_stacks.py and tests/test_drop_in_fsdp2.py read."""
_SHARED: dict[tuple[str, ...], list[dict]] = {}


def launch_cases(out: Path, *args: str, timeout: float = 900) -> list[dict]:
    """Every rank's results of the cases the worker runs with ``args`` (e.g. ``--modules NAME``)."""
    run = torchrun(str(WORKER), 4, args=["--out", str(out), *args], timeout=timeout, run_dir=out)
    if not run.ok:
        pytest.fail(f"4-rank launch failed:\n{run.error}", pytrace=False)
    return [json.loads((out / f"drop_in_rank{r}.json").read_text()) for r in range(4)]


def shared_launch(tmp_path_factory, modules: tuple[str, ...]) -> list[dict]:
    """One launch of ``modules``' cases per pytest session, read by every test module that names them (a launch
    starts 4 ranks: minutes here); 40 minutes allowed, as about 25 cases train twice side by side."""
    if modules not in _SHARED:
        out = tmp_path_factory.mktemp("drop_in_shared")
        _SHARED[modules] = launch_cases(out, "--modules", ",".join(modules), timeout=2400)
    return _SHARED[modules]


def case_result(results: list[dict], name: str) -> dict:
    """Rank 0's result of ``name``; fails with the traceback of any rank on which the case raised."""
    for rank, per_rank in enumerate(results):
        assert "error" not in per_rank[name], f"rank {rank}:\n{per_rank[name]['error']}"
    return results[0][name]
