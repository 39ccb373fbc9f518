"""One run is one record (``RunSpec``) from the command line to the worker, its options resolved once.

No worker starts here: the launch is replaced by a stub that keeps the batch file the workers would read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes import registry, worker
from hyper_parallel.recipes.options import RunOptions
from hyper_parallel.recipes.run_spec import WORKER_MODULE, RunSpec
from launch import cli
from launch.runs import resolve_run


class Launched(Exception):
    """Raised by the stub in place of torchrun, carrying what the workers would have read."""


def test_a_cli_run_reaches_the_worker_as_one_record_resolved_once(monkeypatch, tmp_path):
    resolved = []

    def counting(*args, **kwargs):
        resolved.append(args[0])
        return resolve(*args, **kwargs)

    def launched(module, world_size, *, args, **kwargs):
        batch = Path(args[args.index("--batch") + 1])
        raise Launched(module, world_size, json.loads(batch.read_text()), batch)

    resolve = registry.resolve
    monkeypatch.setattr(registry, "resolve", counting)
    monkeypatch.setattr("launch.runs.torchrun_claimed", launched)
    out = tmp_path / "m4"
    with pytest.raises(Launched) as launch:
        cli.main(["run", "M4", "--dp-shard", "2", "--steps", "1", "--out", str(out), "--quiet"])
    module, world_size, batch, batch_file = launch.value.args
    assert resolved == ["M4"]  # the options of the one run, resolved once in the parent
    assert (module, world_size) == (WORKER_MODULE, 2)
    degrees = dict(world_size=2, dp_replicate=1, dp_shard=2, cp=1, ulysses=1, tp=1, pp=1, ep=1, etp=1)
    record = {
        "recipe": "M4",
        "degrees": degrees,
        "options": {"global_batch": 16},  # MLP_SHAPES' default: 16 rows split over dp_shard 2
        "adapted": {},
        "steps": 1,
        "seed": 0,
        "overlap": None,
        "reshard_after_forward": None,
        "out": str(out),
        "link": None,  # no emulated link
    }
    assert batch == [record]
    (spec,) = worker.specs_of(worker.parse_args(["--batch", str(batch_file)]), world_size)
    assert spec == RunSpec("M4", ParallelDims(**degrees), RunOptions(global_batch=16), 1, out=out)
    assert len(resolved) == 1  # the worker reads the record as written


def test_a_record_keeps_its_adapted_options_through_json():
    """P1 on pp=2 x dp_shard=4: each dp rank gets 8 / 4 = 2 rows, so the default 4 microbatches adapt to 2."""
    spec = resolve_run("P1", world_size=8, pp=2, dp_shard=4, seed=3, overlap=False)
    assert spec.options.microbatches == 2 and list(spec.options.adapted) == ["microbatches"]
    again = RunSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec and again.options.notes() == spec.options.notes()


def test_the_multinode_flags_say_the_same_run():
    """``worker_args`` is what ``python -m launch command`` prints; the worker turns it back into the record
    (the adapted microbatches adapted again on the node, to the same value and note)."""
    spec = resolve_run(
        "P1", world_size=8, pp=2, dp_shard=4, seed=3, overlap=False, reshard_after_forward=True, out="runs/p1"
    )
    args = spec.worker_args()
    assert args[:2] == ["-m", WORKER_MODULE] and args[-2:] == ["--out", "runs/p1"]
    assert "microbatches" not in json.loads(args[args.index("--options") + 1])
    (again,) = worker.specs_of(worker.parse_args(args[2:]), world_size=8)
    assert again == spec and again.options.notes() == spec.options.notes()
