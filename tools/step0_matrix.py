"""Step 0 against a later step on every recipe, two source trees side by side: the first step's excess
before and after a change, and whether the two trees' numbers agree bit for bit.

    .venv/bin/python tools/step0_matrix.py --before /tmp/before40              every recipe, fresh launches
    .venv/bin/python tools/step0_matrix.py --before /tmp/before40 --recipes S2,M6 --rounds 2 --pool

``--before`` is another checkout of this repository (e.g. a clone at an older commit, outside this one);
``--after`` defaults to this tree. One driver process per tree imports that tree's ``launch`` and
``hyper_parallel``: from its own .venv (``make install`` there), or, for a checkout without one, under this
interpreter with the tree first on PYTHONPATH; the controller sends both the same
recipes one at a time, alternating which tree goes first (A B, B A, ...), so a slow moment of a shared machine
hits both. Each run is the recipe at its default degrees, ``--steps`` (3) steps, its step times from rank 0's
``metrics.json``. Without ``--pool`` every run is a fresh torchrun launch (what a user's first launch pays:
no warm worker, no cache); with it each tree keeps its own warm pool (what a relaunch pays), and with
``--rounds`` above 1 the pool's first run of each recipe (round 0) and the relaunches are also shown apart.

Per recipe: the median over rounds of step 0 and of the later steps' median, before and after, step 0 / later,
and whether losses, ``max_abs_diff`` and ``max_param_diff`` are equal bit for bit between the trees. The sum
over recipes of step 0 minus the later step is the matrix's step-0 excess. The load average is printed at the
start and the end: the machine may be shared. Writes ``--out`` (JSON of every run) when given. Only the
ratios measured side by side mean something; nothing here is asserted on times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPLY = "STEP0-MATRIX "
"""The prefix of a driver's reply line on stdout (anything else a run prints is passed over)."""
TREES = ("before", "after")


def serve() -> None:
    """Driver: one JSON request per stdin line ({"recipe", "steps", "pool"}), one reply line per run."""
    import launch  # this tree's launcher: the driver runs in the tree's own .venv

    for line in sys.stdin:
        request = json.loads(line)
        result = launch.run(request["recipe"], steps=request["steps"], pool=request["pool"], timeout=1800)
        metrics = result.metrics
        reply = {
            "recipe": request["recipe"],
            "ok": result.ok,
            "error": None if result.ok else (result.error or "")[-2000:],
            "step_times": metrics.get("step_times", []),
            "losses": [float(x).hex() for x in metrics.get("losses", [])],
            "max_abs_diff": _hex(metrics.get("max_abs_diff")),
            "max_param_diff": _hex(metrics.get("max_param_diff")),
            "duration": result.process.duration,
            "source": str(Path(launch.__file__).resolve().parents[1]),  # the tree this driver imported
        }
        print(REPLY + json.dumps(reply), flush=True)
    launch.shutdown_pool()  # a no-op without a pool


def _hex(value: float | None) -> str | None:
    """A float as its exact bits, so equality below is bit equality."""
    return None if value is None else float(value).hex()


class Driver:
    """One tree's driver process, talked to over its stdin and stdout."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        python, env = tree_python(tree)
        self.process = subprocess.Popen(
            [str(python), str(Path(__file__).resolve()), "--serve"],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, recipe: str, steps: int, pool: bool) -> dict:
        self.process.stdin.write(json.dumps({"recipe": recipe, "steps": steps, "pool": pool}) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(REPLY):
                reply = json.loads(line[len(REPLY) :])
                if Path(reply["source"]) != self.tree:
                    raise RuntimeError(f"the driver for {self.tree} imported the launcher from {reply['source']}")
                return reply
        raise RuntimeError(f"the driver ended during {recipe} (exit {self.process.wait()})")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=300)


def tree_python(tree: Path) -> tuple[Path, dict[str, str]]:
    """The interpreter and environment that import ``tree``'s packages: its own .venv, or (a checkout without
    one) this interpreter with the tree first on PYTHONPATH, run from the tree (the workers inherit both)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("PYTHONPATH", None)
    python = tree / ".venv" / "bin" / "python"
    if python.exists():
        return python, env
    return Path(sys.executable), {**env, "PYTHONPATH": str(tree)}


def later_step(step_times: list[float]) -> float:
    """The median of the steps after step 0."""
    return statistics.median(step_times[1:])


def summarise(runs: list[dict]) -> list[dict]:
    """One row per recipe from every run's reply (each with "tree" and "recipe"): medians over rounds of
    step 0 and the later step per tree, their ratio and excess, and whether every run of both trees has
    the same losses and differences bit for bit."""
    rows = []
    for recipe in dict.fromkeys(run["recipe"] for run in runs):
        mine = [run for run in runs if run["recipe"] == recipe]
        row = {"recipe": recipe, "ok": all(run["ok"] for run in mine)}
        for tree in TREES:
            times = [run["step_times"] for run in mine if run["tree"] == tree and len(run["step_times"]) > 1]
            if not times:
                row[tree] = None
                continue
            first = statistics.median(t[0] for t in times)
            later = statistics.median(later_step(t) for t in times)
            row[tree] = {"step0": first, "later": later, "ratio": first / later, "excess": first - later}
        numbers = {(tuple(run["losses"]), run["max_abs_diff"], run["max_param_diff"]) for run in mine}
        row["bit_equal"] = len(numbers) == 1 and {run["tree"] for run in mine} == set(TREES)
        rows.append(row)
    return rows


def excess_sum(rows: list[dict], tree: str) -> float:
    """The matrix's step-0 excess: step 0 minus the later step, summed over the recipes both trees ran."""
    return sum(row[tree]["excess"] for row in rows if row["before"] and row["after"])


def table(rows: list[dict]) -> str:
    lines = [
        "| recipe | step 0 s, before / after | later step s, before / after | step 0 / later, before -> after | losses |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        before, after = row["before"], row["after"]
        if not (before and after):
            lines.append(f"| {row['recipe']} | (one tree only) | | | |")
            continue
        flag = " **> 2**" if after["ratio"] > 2 else ""
        equal = "bit-equal" if row["bit_equal"] else "DIFFER"
        lines.append(
            f"| {row['recipe']} | {before['step0']:.3f} / {after['step0']:.3f} | {before['later']:.3f} / "
            f"{after['later']:.3f} | {before['ratio']:.2f} -> {after['ratio']:.2f}{flag} | {equal} |"
        )
    lines.append(
        f"\nstep-0 excess summed over {sum(1 for r in rows if r['before'] and r['after'])} recipes: "
        f"{excess_sum(rows, 'before'):.2f} s before, {excess_sum(rows, 'after'):.2f} s after"
    )
    return "\n".join(lines)


def recipe_names(tree: Path) -> list[str]:
    """The recipes of ``tree``'s registry, in its order (``python -m launch list``'s)."""
    code = "from hyper_parallel.recipes.registry import RECIPES; print(' '.join(RECIPES))"
    python, env = tree_python(tree)
    return subprocess.run(
        [str(python), "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True
    ).stdout.split()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before", type=Path, help="the other checkout (with its own .venv)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--recipes", help="comma-separated names (default: every recipe both trees have)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pool", action="store_true", help="warm pools (a relaunch) instead of fresh launches")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--summarise", type=Path, help="print the tables of an earlier --out file and exit")
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return 0
    if args.summarise:
        runs = json.loads(args.summarise.read_text())["runs"]
        return report(runs, pool=True, rounds=1 + max(run["round"] for run in runs))
    if args.before is None:
        parser.error("--before is required")
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 0 and a later one)")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    known = set(recipe_names(trees["before"]))
    names = args.recipes.split(",") if args.recipes else [n for n in recipe_names(trees["after"]) if n in known]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    drivers = {tree: Driver(path) for tree, path in trees.items()}
    runs = []
    try:
        for round_index in range(args.rounds):
            for index, recipe in enumerate(names):
                order = TREES if (round_index * len(names) + index) % 2 == 0 else TREES[::-1]
                for tree in order:
                    reply = drivers[tree].run(recipe, args.steps, args.pool)
                    runs.append({**reply, "tree": tree, "round": round_index, "load": os.getloadavg()[0]})
                    times = ", ".join(f"{t:.3f}" for t in reply["step_times"])
                    print(f"round {round_index} {recipe:8s} {tree:6s} ok={reply['ok']} steps [{times}]", flush=True)
    finally:
        for driver in drivers.values():
            driver.close()
    print(f"load average at end: {os.getloadavg()}")
    if args.out:
        args.out.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "runs": runs}))
    return report(runs, args.pool, args.rounds)


def report(runs: list[dict], pool: bool, rounds: int) -> int:
    """Print the tables; 0 when every run matched its reference and both trees' numbers are bit-equal."""
    rows = summarise(runs)
    print(table(rows))
    if pool and rounds > 1:  # a pool's first run of a recipe and its relaunches are different things
        for title, chosen in (("first run on each pool", [0]), ("warm relaunches", range(1, rounds))):
            print(f"\n{title} (rounds {list(chosen)}):\n" + table(summarise([r for r in runs if r["round"] in chosen])))
    return 0 if all(row["ok"] and row["bit_equal"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
