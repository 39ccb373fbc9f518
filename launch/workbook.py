"""``make workbook``: run the workbook headless into ``runs/<timestamp>/`` and say where it is.

For now the workbook is one recipe end to end (M1 on 2 ranks); notebooks executed by papermill
join it when they exist.
"""
from __future__ import annotations

import datetime
from pathlib import Path

DEFAULT_RUNS = (("M1", {"world_size": 2, "dp_shard": 2}),)


def run_workbook(out: Path) -> int:
    from launch.runner import run
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = out / stamp
    failures = 0
    for recipe, degrees in DEFAULT_RUNS:
        result = run(recipe, out=root / recipe.lower(), **degrees)
        summary = result.summary()
        status = "OK" if result.ok else "FAILED"
        print(f"{status} {recipe} {degrees}: losses {[round(x, 6) for x in summary['losses']]}, "
              f"reference {[round(x, 6) for x in summary['reference_losses']]}, "
              f"max |diff| {summary['max_abs_diff']}, {summary['duration']:.1f}s")
        if not result.ok:
            failures += 1
            print(result.error)
    print(f"workbook written to {root}")
    return 1 if failures else 0
