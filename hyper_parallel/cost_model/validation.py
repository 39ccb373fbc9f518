"""Refusing what cannot run before anything is costed: every message names the rule and the nearest
value that would be accepted (and never suggests a world size the degrees do not divide).

The rules a single ``ParallelDims`` or ``ModelConfig`` can check live there (``hyper_parallel.mesh``,
``model_configs``); these are the ones that need the request as a whole: a degree that does not divide
the world (suggest the nearest divisor, not a bigger world), the step's sizes against every layout
being planned (suggest the smallest size all of them accept), and the command line's own numbers.
"""

from __future__ import annotations

import math

from hyper_parallel.mesh_dims import DEGREE_NAMES, MeshDim

# The degrees whose product is the world size (ep and etp borrow their ranks from these).
SPLIT_DEGREES = tuple(d for d in DEGREE_NAMES if d not in (MeshDim.EP, MeshDim.ETP))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n >= 1 else []


def nearest_divisor(n: int, value: int) -> int:
    """The divisor of ``n`` closest to ``value`` (ties go to the smaller one)."""
    return min(divisors(n), key=lambda d: (abs(d - value), d))


def check_degrees_divide(world_size: int, degrees: dict[str, int | None]) -> None:
    """``ValueError`` when a degree given (not None, not dp_shard=-1) cannot be part of ``world_size``
    ranks: it must divide the world, and with the others given, their product must too."""
    if world_size is None or world_size < 1:
        return  # ParallelDims names that rule
    given = {k: v for k, v in degrees.items() if k in SPLIT_DEGREES and v is not None and v >= 1}
    if degrees.get("dp_shard") == -1:
        given.pop("dp_shard", None)
    for name, value in given.items():
        if world_size % value:
            raise ValueError(
                f"{name}={value} does not divide world_size={world_size} (the degrees multiply to the world "
                f"size); nearest valid {name}: {nearest_divisor(world_size, value)}"
            )
    product = math.prod(given.values())
    if world_size % product:
        name, value = max(given.items(), key=lambda item: item[1])
        rest = product // value
        valid = [d for d in divisors(world_size) if world_size % (d * rest) == 0]
        hint = (
            f"nearest valid {name} with the others kept: {min(valid, key=lambda d: (abs(d - value), d))}"
            if valid
            else "lower the other degrees"
        )
        raise ValueError(
            f"{' x '.join(f'{k}={v}' for k, v in given.items())} = {product} does not divide "
            f"world_size={world_size}; {hint}"
        )


def smallest_valid_seq_len(layouts: list, sequence_parallel: bool = True) -> int:
    """The smallest sequence every layout accepts: 2 tp cp with CP, tp with SP, else 1 (mesh.check_model)."""
    need = 1
    for dims in layouts:
        step = dims.tp * 2 * dims.cp if dims.cp > 1 else (dims.tp if sequence_parallel else 1)
        need = math.lcm(need, step)
    return need


def check_step_sizes(seq_len: int | None, global_batch: int | None, layouts: list) -> None:
    """``--seq-len`` and ``--batch`` must be >= 1; the nearest valid value is the smallest one every layout
    planned accepts (a multiple of each dp for the batch)."""
    if global_batch is not None and global_batch < 1:
        smallest = math.lcm(*(d.dp for d in layouts)) if layouts else 1
        raise ValueError(
            f"--batch (sequences per step) must be >= 1, got {global_batch}; nearest valid --batch: {smallest} "
            "(one sequence per data-parallel rank)"
        )
    if seq_len is not None and seq_len < 1:
        raise ValueError(
            f"--seq-len (tokens per sequence) must be >= 1, got {seq_len}; nearest valid --seq-len: "
            f"{smallest_valid_seq_len(layouts)}"
        )
