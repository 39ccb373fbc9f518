"""A text plan and its --compare import no plotting library: matplotlib costs about half a second of CPU to
import, a third of a --compare over 4,096 ranks (hyper_parallel/cost_model/layouts.fmt_bytes is the plan's
byte format for that reason; the figures re-export it)."""

from __future__ import annotations

import subprocess
import sys

PROBE = (
    "import sys, contextlib, io\n"
    "from launch.cli import main\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    main(['plan', '--world', '64', '--model', 'llama-8b-like', '--compare', '--top', '3'])\n"
    "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))\n"
)


def test_plan_compare_imports_no_matplotlib():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_fmt_bytes_is_one_function_for_plans_and_figures():
    from hyper_parallel.cost_model.layouts import fmt_bytes
    from hyper_parallel.viz.style import fmt_bytes as figures_fmt_bytes

    assert figures_fmt_bytes is fmt_bytes
    assert [fmt_bytes(n) for n in (512, 1536, 3 * 1024**2, 1.5 * 1024**3, 2048 * 1024**3)] == [
        "512 B",
        "1.5 KiB",
        "3.0 MiB",
        "1.5 GiB",
        "2048.0 GiB",
    ]
