"""Two runs side by side: ``python -m launch report --compare RUN_A RUN_B [--out compare.html]``.

One self-contained page (the run report's stylesheet): the runs' facts in two columns (verdict,
degrees, numerics, step time, the cost model's check, the layout at scale), then every (op, group)
either run traced on rank 0 in its last step, measured and predicted by the cost model for each, with
the table as CSV. Torch is never imported.
"""

from __future__ import annotations

from pathlib import Path

from hyper_parallel.mesh_dims import degrees_label
from hyper_parallel.run_files import write_atomic
from launch.report.markup import esc, num_cell
from launch.report.predicted import at_scale, at_scale_sentence, volume_rows
from launch.report.run_data import RunData, read_run
from launch.report.style import STYLESHEET
from launch.report.summary import communication_check, csv_link

COMPARE_FILE = "compare.html"


def _facts(run: RunData, volume: list[dict] | None) -> dict[str, str]:
    times = run.value("step_times") or []
    diff = run.value("max_abs_diff")
    scaled = at_scale(run)
    return {
        "recipe": run.recipe_name or "?",
        "verdict": run.verdict,
        "degrees": degrees_label(run.degrees, world=True),
        "steps": str(len(run.value("losses") or [])),
        "max |loss - reference|": f"{diff:.2e}" if isinstance(diff, (int, float)) else "–",
        "mean step time (CPU, gloo)": f"{sum(times) / len(times):.3f} s" if times else "–",
        "communication on rank 0": communication_check(volume),
        "this layout at scale": at_scale_sentence(scaled) if scaled else "–",
    }


def comparison_rows(volume_a: list[dict] | None, volume_b: list[dict] | None) -> list[dict]:
    """(op, group) of either run with both runs' measured and predicted bytes (None where absent)."""
    a = {(r["op"], r["group"]): r for r in volume_a or []}
    b = {(r["op"], r["group"]): r for r in volume_b or []}
    return [
        {
            "op": op,
            "group": group,
            "measured_a": a.get((op, group), {}).get("measured"),
            "predicted_a": a.get((op, group), {}).get("predicted"),
            "measured_b": b.get((op, group), {}).get("measured"),
            "predicted_b": b.get((op, group), {}).get("predicted"),
        }
        for op, group in list(a) + [key for key in b if key not in a]
    ]


def build_comparison(run_dir_a: str | Path, run_dir_b: str | Path) -> str:
    runs = [read_run(run_dir_a), read_run(run_dir_b)]
    volumes = [volume_rows(run) for run in runs]
    facts = [_facts(run, volume) for run, volume in zip(runs, volumes)]
    names = [f"A: {esc(runs[0].run_dir.name)}", f"B: {esc(runs[1].run_dir.name)}"]
    fact_rows = "".join(
        f"<tr><th>{esc(key)}</th><td data-run='a'>{esc(facts[0][key])}</td>"
        f"<td data-run='b'>{esc(facts[1][key])}</td></tr>"
        for key in facts[0]
    )
    rows = comparison_rows(*volumes)
    keys = ("measured_a", "predicted_a", "measured_b", "predicted_b")
    comm_rows = "".join(
        f"<tr><td>{esc(r['op'])}</td><td>{esc(r['group'])}</td>"
        + "".join(num_cell(r[k], ",.0f", k) for k in keys)
        + "</tr>"
        for r in rows
    )
    download = csv_link(
        "comparison.csv",
        ("op", "group") + keys,
        [[r["op"], r["group"]] + ["" if r[k] is None else r[k] for k in keys] for r in rows],
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Runs compared: {names[0]} / {names[1]}</title>
<style>{STYLESHEET}</style></head><body>
<header class="{"ok" if all(r.ok for r in runs) else "failed"}"><div class="inner"><span class="verdict">COMPARISON</span>
<h1>{names[0]} &nbsp;vs&nbsp; {names[1]}</h1>
<p class="meta">{esc(runs[0].run_dir)} · {esc(runs[1].run_dir)}</p></div></header><main>
<section id="facts"><h2>Side by side</h2><table class="facts"><thead><tr><th></th><th>{names[0]}</th>
<th>{names[1]}</th></tr></thead><tbody>{fact_rows}</tbody></table></section>
<section id="communication"><h2>Communication, rank 0, last step</h2>
<table id="comparison-table"><thead><tr><th>op</th><th>group</th><th>A measured</th><th>A cost model</th>
<th>B measured</th><th>B cost model</th></tr></thead><tbody>{comm_rows}</tbody></table>{download}
<p class="note">Bytes are sums of full buffers, both phases (the trace convention). –: the run has no such
collective (or no traces).</p></section></main>
<footer>Written by <code>python -m launch report --compare</code>. Self-contained.</footer></body></html>
"""


def write_comparison(run_dir_a: str | Path, run_dir_b: str | Path, out: str | Path | None = None) -> Path:
    """Write the comparison page (default: ``compare.html`` in RUN_A's parent folder) and return its path."""
    page = build_comparison(run_dir_a, run_dir_b)
    path = Path(out) if out is not None else Path(run_dir_a).resolve().parent / COMPARE_FILE
    if path.is_dir() or not path.suffix:
        path = path / COMPARE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, page).resolve()
