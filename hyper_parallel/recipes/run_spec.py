"""One recipe run as one record, from the command line or a notebook to the ranks that train it.

    launch.run / run_many / the CLI / the widget    ``launch.runs.resolve_run(...)``: a ``RunSpec``, its
                                                    options resolved once, on its mesh, in the parent
    batch.json, the warm pool's task                ``spec.to_json()``, read back by ``RunSpec.from_json``
    python -m launch command (multi-node)           ``spec.worker_args()``: the worker's own flags
    python -m hyper_parallel.recipes.worker         reads either and trains ``run_one(spec)``

Torch-free, so the launcher builds and checks it before any worker starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyper_parallel.link import Link, parse_link
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes import registry
from hyper_parallel.recipes.options import OPTION_NAMES, RunOptions

WORKER_MODULE = "hyper_parallel.recipes.worker"
"""What every rank of a recipe launch runs (``python -m``), on one machine or many."""


@dataclass(frozen=True)
class RunSpec:
    """Everything a worker needs to train one run of a recipe and check it against its reference."""

    recipe: str  # the registry's name (``registry.get`` spells it)
    dims: ParallelDims
    options: RunOptions  # resolved on ``dims``: every knob's value and why a default changed
    steps: int
    seed: int = 0
    overlap: bool | None = None  # None: the worker's HYPER_PARALLEL_OVERLAP decides
    # None: the recipe's choice (FSDP2's default, or none under PP); True: every unit below another reshards
    # after forward (fewer gathered bytes, more all-gathers); False: no unit does
    reshard_after_forward: bool | None = None
    out: Path | None = None  # the run's directory (None: the launcher picks one, or the worker's --out)
    link: Link | None = None  # an emulated link every traced collective waits for (hyper_parallel.link); None: none

    @classmethod
    def resolve(
        cls,
        recipe: str,
        degrees: Mapping[str, int],
        options: Mapping[str, int | None] | None = None,
        *,
        steps: int | None = None,
        seed: int = 0,
        overlap: bool | None = None,
        reshard_after_forward: bool | None = None,
        out: str | Path | None = None,
        link: Link | str | None = None,
    ) -> RunSpec:
        """The run of ``recipe`` on ``degrees`` (world_size included): its rules checked and its ``options``
        resolved on the mesh (left out: the recipe's default, adapted when it does not fit), or ``ValueError``."""
        row = registry.get(recipe)
        dims = row.check_degrees(**degrees)
        return cls(
            row.name,
            dims,
            row.options(dims, **(options or {})),
            row.steps if steps is None else steps,
            seed,
            overlap,
            reshard_after_forward,
            None if out is None else Path(out),
            parse_link(link),
        )

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (batch.json, the warm pool's task)."""
        return {
            "recipe": self.recipe,
            "degrees": self.dims.degrees(),
            "options": self.options.values(),
            "adapted": dict(self.options.adapted),
            "steps": self.steps,
            "seed": self.seed,
            "overlap": self.overlap,
            "reshard_after_forward": self.reshard_after_forward,
            "out": None if self.out is None else str(self.out),
            "link": None if self.link is None else self.link.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSpec:
        """The record ``to_json`` wrote, as it was (nothing is resolved again)."""
        values = data["options"]
        return cls(
            data["recipe"],
            ParallelDims(**data["degrees"]),
            RunOptions(**{name: values.get(name) for name in OPTION_NAMES}, adapted=dict(data["adapted"])),
            data["steps"],
            data["seed"],
            data["overlap"],
            data["reshard_after_forward"],
            None if data["out"] is None else Path(data["out"]),
            Link.from_json(data.get("link")),
        )

    def worker_args(self) -> list[str]:
        """``-m hyper_parallel.recipes.worker`` and its flags for this run, as a multi-node torchrun line
        gives them: the degrees without world_size (torchrun gives it), the options that were not adapted
        (each rank adapts the others the same way, ``RunOptions.kept``)."""
        explicit = {name: value for name, value in self.dims.degrees().items() if name != "world_size"}
        args = ["-m", WORKER_MODULE, "--recipe", self.recipe, "--degrees", json.dumps(explicit)]
        args += ["--options", json.dumps(self.options.kept()), "--steps", str(self.steps)]
        if self.seed != 0:
            args += ["--seed", str(self.seed)]
        if self.overlap is not None:
            args += ["--overlap", "on" if self.overlap else "off"]
        if self.reshard_after_forward is not None:
            args += ["--reshard-after-forward", "on" if self.reshard_after_forward else "off"]
        if self.out is not None:
            args += ["--out", str(self.out)]
        if self.link is not None:
            args += ["--link", self.link.text()]
        return args
