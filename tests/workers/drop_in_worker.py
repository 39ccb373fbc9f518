"""torchrun worker for tests/test_drop_in.py: our fully_shard as a drop-in for torch FSDP2 on models we did
not write. Every case (registered by the ``drop_in_*_cases.py`` modules imported below) runs in this one
4-rank launch and trains one model three times side by side (drop_in_training.run_three: the
single-process reference on the global batch, torch's ``fully_shard``, ours) for ``STEPS`` AdamW steps,
recording per rank the losses and the largest difference of ours against torch and against the reference
for every gradient and parameter, plus ``facts`` a case needs beyond numbers (traced collective bytes); a
case that raises records its traceback and the ranks meet at a barrier before the next. Output:
``OUT/drop_in_rank{r}.json``; run as ``torchrun --nproc-per-node 4 tests/workers/drop_in_worker.py --out DIR``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
from pathlib import Path

import torch
import torch.distributed as dist
from case_runner import run_cases
from drop_in_training import CASES

DEFAULT_MODULES = "drop_in_parameter_cases,drop_in_unit_cases,drop_in_mesh_cases"
"""The features whose cases a launch runs (``--modules``): importing a module registers its cases in ``CASES``
(each case builds its own seeded model and mesh, so their order does not matter)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="all")
    parser.add_argument("--modules", default=DEFAULT_MODULES)
    args = parser.parse_args()
    for name in args.modules.split(","):
        importlib.import_module(name)
    os.environ["DROP_IN_OUT"] = args.out
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    run_cases(CASES, args.cases, Path(args.out) / f"drop_in_rank{dist.get_rank()}.json")


if __name__ == "__main__":
    main()
