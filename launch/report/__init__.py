"""One self-contained HTML report per run directory: what to send when a run needs discussing.

    python -m launch report RUN_DIR [--out report.html]     default: RUN_DIR/report.html
    launch.report.write_report(run_dir, out=None)           the same from Python; returns the path

The page opens with a one-screen summary, then holds the run's degrees, the recipe (description and
matrix row), the numerics against the single-process reference, the ``hyper_parallel.viz`` figures (mesh map, placement transitions,
timeline, communication volume against theory) inlined as PNG, and every rank's log folded in a
``<details>``. It opens offline in any browser and prints with the figures kept whole. A failed run
gets a report too, with the error first. Torch is never imported (this runs in the parent process).

    run_data.py   read a run directory (summary, metrics, traces present, torchrun's per-rank logs)
    page.py       render the HTML: layout and the sections of a run;  style.py  its stylesheet
    markup.py     escaping, tables and number cells shared by the pages;  figure_blocks.py  the figures
    log_section.py  every rank's log, folded;  build.py  figures + render + write
    summary.py    the first screen (verdict, numerics, communication against the cost model, the layout
                  at scale) and the tables as CSV downloads;  predicted.py  the cost model's side of it
    compare.py    two runs side by side (python -m launch report --compare RUN_A RUN_B)
"""

from launch.report.build import REPORT_FILE, build_report, find_run_dirs, write_report, write_reports
from launch.report.run_data import RunData, read_run

__all__ = ["REPORT_FILE", "RunData", "build_report", "find_run_dirs", "read_run", "write_report", "write_reports"]
