"""The report's Logs section: every rank's output folded in a ``<details>``, the failed rank marked.

Log text is escaped line by line (``esc``): a log can hold anything, including markup. Torch is never
imported.
"""

from __future__ import annotations

from launch.report.markup import esc
from launch.report.run_data import LogFile, RunData


def _log_block(log: LogFile) -> str:
    name = "torchrun's output" if log.rank < 0 else log.stream + (".log" if log.path else "")
    cut = (
        (
            f"<p class='note'>the first {log.omitted} lines are not shown"
            + (f"; the whole file: <code>{esc(log.path)}</code>" if log.path else "")
            + "</p>"
        )
        if log.omitted
        else ""
    )
    body = f"<pre>{esc(chr(10).join(log.lines))}</pre>" if log.lines else "<p class='note'>(empty)</p>"
    return f"<h3>{esc(name)}</h3>{cut}{body}"


def logs_section(run: RunData) -> str:
    """Every rank's log folded in ``<details>``, failures open: the evidence behind the verdict."""
    parts = ["<section id='logs'><h2>Logs</h2>"]
    if not run.logs:
        parts.append(
            "<p class='note'>No per-rank log files were found (torchrun_logs_* in the run directory, or next "
            "to batch.json in its parent for runs that shared a launch).</p></section>"
        )
        return "".join(parts)
    source = run.logs[0].path.parents[3] if run.logs[0].path else None
    shared = source is not None and source.parent != run.run_dir
    parts.append(
        "<p class='lead'>Every rank's output, folded; click a rank to open it"
        + (f". Files under <code>{esc(source)}</code>" if source else "")
        + ("; this launch ran several runs one after another, and its logs hold all of them" if shared else "")
        + ".</p>"
    )
    by_rank: dict[int, list[LogFile]] = {}
    for log in run.logs:
        by_rank.setdefault(log.rank, []).append(log)
    for rank, logs in by_rank.items():
        failed = rank == run.failed_rank
        counts = ", ".join(f"{log.stream} {len(log.lines) + log.omitted} lines" for log in logs)
        label = ("torchrun" if rank < 0 else f"rank {rank}") + f" · {counts}" + (" · FAILED" if failed else "")
        parts.append(
            f"<details class='log{' failed' if failed else ''}' data-rank='{rank}'><summary>{esc(label)}"
            f"</summary><div>{''.join(_log_block(log) for log in logs)}</div></details>"
        )
    return "".join(parts) + "</section>"
