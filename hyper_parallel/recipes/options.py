"""A recipe's knobs that depend on the mesh: global batch, sequence length, experts, pipeline microbatches.

A recipe's ``shapes`` hold each knob's default (``matrix_shapes``). Whether a value fits depends on the
degrees: the batch splits over dp, the sequence into 2*cp chunks (and tp slices under SP), the experts
over ep, each data-parallel rank's rows into microbatches, at least one per pipeline stage. So a run
resolves its knobs against its ``ParallelDims`` (``resolve``):

- a value the user gave is checked, and a value that does not fit is a ``ValueError`` naming the option
  (``--microbatches`` on the command line, ``microbatches=`` in ``launch.run``) and its nearest valid values;
- a knob the user left out takes the recipe's default when it fits, otherwise the nearest value that does,
  and ``RunOptions.adapted`` says why (the run's summary shows it). Every valid mesh runs.

Torch-free: the launcher resolves the options in the parent process (a bad value costs milliseconds),
the worker again from the values that were not adapted (``RunOptions.kept``), to the same result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hyper_parallel.mesh import ParallelDims

OPTION_NAMES = ("global_batch", "seq_len", "num_experts", "microbatches")
"""In resolution order: the microbatches split the rows the global batch gives each dp rank."""
SEARCH_SPAN = 1 << 20
"""How far from a value the nearest valid one is looked for (every rule has one within a few multiples of
the degrees, so the search only ends here for values no mesh could use)."""
TOP_K = 2  # the MoE recipes route each token to 2 experts: fewer experts than that cannot route


def flag(name: str) -> str:
    """How the user sets an option: the CLI flag and the keyword of ``launch.run``."""
    return f"--{name.replace('_', '-')} (launch.run's {name}=)"


@dataclass(frozen=True)
class RunOptions:
    """The resolved knobs of one run; None for a knob the recipe does not have."""

    global_batch: int | None = None
    seq_len: int | None = None
    num_experts: int | None = None
    microbatches: int | None = None
    adapted: dict[str, str] = field(default_factory=dict, compare=False)  # knob -> why its default changed

    def values(self) -> dict[str, int]:
        """The knobs this recipe has, by name (what ``check_model`` checks, what the run records)."""
        return {name: getattr(self, name) for name in OPTION_NAMES if getattr(self, name) is not None}

    def kept(self) -> dict[str, int]:
        """The knobs that were not adapted: what the launcher tells the worker, which resolves the others
        again (the same way, so to the same values) and records why they changed."""
        return {name: value for name, value in self.values().items() if name not in self.adapted}

    def notes(self) -> list[str]:
        """One sentence per adapted default, e.g. for a run's summary."""
        return [f"{name}={getattr(self, name)} ({why})" for name, why in self.adapted.items()]


@dataclass(frozen=True)
class _Rule:
    """Which values of one knob fit a mesh: ``broken(value, chosen)`` is the broken rule's message or None
    (``chosen``: the knobs resolved before this one)."""

    broken: Callable[[int, dict[str, int]], str | None]
    prefer_smaller: bool = False  # adapting a default: the largest fitting value below it first (microbatches)
    choices: Callable[[dict[str, int]], list[int]] | None = None  # all fitting values, where few fit
    otherwise: Callable[[int, dict[str, int]], str] | None = None  # the other knob that would make it fit


def _rules(dims: ParallelDims, shapes: dict) -> dict[str, _Rule]:
    """The rules are ``ParallelDims.check_model``'s (one home for them), asked one knob at a time."""
    stages_per_rank = shapes.get("stages_per_rank", 1)
    stages = dims.pp * stages_per_rank

    def check(**shape) -> str | None:
        try:
            dims.check_model(**shape)
        except ValueError as error:
            return str(error)
        return None

    def microbatches(value: int, chosen: dict[str, int]) -> str | None:
        return check(global_batch=chosen["global_batch"], microbatches=value, stages_per_rank=stages_per_rank)

    # a model of fixed row length (M4-F8's MLP) asks float8's tokens rule of the batch alone
    float8_rows = {k: shapes[k] for k in ("float8_dims", "row_tokens") if "row_tokens" in shapes and k in shapes}

    def global_batch(value: int, chosen: dict[str, int]) -> str | None:
        broken = check(global_batch=value, **float8_rows)
        if broken is None and "microbatches" in shapes and value // dims.dp < stages:
            return (
                f"each dp rank's {value // dims.dp} rows (global_batch={value} / dp={dims.dp}) cannot fill the "
                f"{stages} pipeline stages (at least one microbatch each)"
            )
        return broken

    def num_experts(value: int, chosen: dict[str, int]) -> str | None:
        if value < TOP_K:
            return f"num_experts={value} is fewer than the top_k = {TOP_K} experts each token is routed to"
        return check(num_experts=value)

    def every_microbatch_count(chosen: dict[str, int]) -> list[int]:
        rows = chosen["global_batch"] // dims.dp
        return [m for m in range(1, rows + 1) if microbatches(m, chosen) is None]

    def batch_for(value: int, chosen: dict[str, int]) -> str:
        if value < stages:
            return ""
        batch = -(-chosen["global_batch"] // (dims.dp * value)) * dims.dp * value
        return f", or set {flag('global_batch')} to {batch}"

    return {
        "global_batch": _Rule(global_batch),
        "seq_len": _Rule(
            lambda v, _: check(
                seq_len=v,
                sequence_parallel=shapes.get("sequence_parallel", False),
                async_tp=shapes.get("async_tp", False),
            )
        ),
        "num_experts": _Rule(num_experts),
        "microbatches": _Rule(microbatches, True, every_microbatch_count, batch_for),
    }


def _fitting(rule: _Rule, chosen: dict[str, int], below: int, above: int) -> tuple[int | None, int | None]:
    """The largest fitting value <= ``below`` and the smallest >= ``above`` (None where there is none).

    A rule with few fitting values picks among its ``choices``: scanning would try the whole span whenever
    no value fits (every microbatch count above a rank's rows), 5 million checks, 15 s, for one picker."""
    if rule.choices is not None:
        fits = rule.choices(chosen)
        return max((v for v in fits if v <= below), default=None), min((v for v in fits if v >= above), default=None)
    down = next((v for v in range(below, max(below - SEARCH_SPAN, 0), -1) if rule.broken(v, chosen) is None), None)
    up = next((v for v in range(max(above, 1), above + SEARCH_SPAN) if rule.broken(v, chosen) is None), None)
    return down, up


def resolve(recipe_name: str, shapes: dict, dims: ParallelDims, **given: int | None) -> RunOptions:
    """The knobs of a run of the recipe (its ``shapes``) on ``dims``: given values checked, the rest adapted."""
    unknown = sorted(set(given) - set(OPTION_NAMES))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; known: {list(OPTION_NAMES)}")
    has = [name for name in OPTION_NAMES if name in shapes]
    for name, value in given.items():
        if value is None:
            continue
        if name not in has:
            raise ValueError(
                f"recipe {recipe_name} has no {name} option (its model has no such knob); its options: "
                + (", ".join(flag(n) for n in has) or "none")
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}; set {flag(name)}")
    rules = _rules(dims, shapes)
    chosen: dict[str, int] = {}
    adapted: dict[str, str] = {}
    for name in has:
        rule, default, value = rules[name], shapes[name], given.get(name)
        broken = rule.broken(value if value is not None else default, chosen)
        if broken is None:
            chosen[name] = value if value is not None else default
            continue
        if value is not None:
            raise ValueError(_refusal(name, value, broken, rule, chosen, dims))
        down, up = _fitting(rule, chosen, default if rule.prefer_smaller else 0, default)
        pick = down if down is not None else up
        if pick is None:
            raise ValueError(f"recipe {recipe_name} cannot run on {_mesh(dims)}: no {name} fits ({broken})")
        chosen[name] = pick
        adapted[name] = f"the default does not fit {_mesh(dims)}: {broken}"
    return RunOptions(**{name: chosen.get(name) for name in OPTION_NAMES}, adapted=adapted)


def microbatch_choices(shapes: dict, dims: ParallelDims, options: RunOptions) -> list[int]:
    """Every microbatch count a pipeline recipe (its ``shapes``) can run on ``dims`` with the global batch of
    ``options`` (the run's resolved options): what a picker offers. Empty for a recipe without microbatches."""
    if "microbatches" not in shapes:
        return []
    return _rules(dims, shapes)["microbatches"].choices(options.values())


def _refusal(name: str, value: int, broken: str, rule: _Rule, chosen: dict[str, int], dims: ParallelDims) -> str:
    if rule.choices is not None:
        valid = rule.choices(chosen)
    else:
        valid = [v for v in _fitting(rule, chosen, value - 1, value + 1) if v is not None]
    advice = f"set {flag(name)} to one of {valid}" if valid else f"no {name} fits: change the degrees"
    if rule.otherwise is not None:
        advice += rule.otherwise(value, chosen)
    return f"{broken}; {advice}"


def _mesh(dims: ParallelDims) -> str:
    active = dims.label(sep=" x ")
    return active if active != "-" else f"{dims.world_size} rank(s)"
