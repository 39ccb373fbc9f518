"""The ``report`` command line: bad input exits with status 2 and a message that says what to pass instead,
one run or two to compare but not both, and the command writes a report without importing torch (checked in
a fresh interpreter). Run directories are synthetic ones written into ``tmp_path``.
"""

from __future__ import annotations

import subprocess
import sys

from report_page import failed_run

from hyper_parallel.run_files import METRICS_FILE
from launch.cli import main as cli_main


def test_invalid_input_exits_2_with_an_actionable_message(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli_main(["report", str(tmp_path / "empty")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    failed_run(tmp_path / "runs" / "M4")
    assert cli_main(["report", str(tmp_path / "runs")]) == 2
    assert "it holds the run directories M4: pass one of them" in capsys.readouterr().err
    broken = failed_run(tmp_path / "broken")
    (broken / METRICS_FILE).write_text("{not json")
    assert cli_main(["report", str(broken)]) == 2
    assert "metrics.json is not valid JSON" in capsys.readouterr().err


def test_cli_writes_the_report_without_importing_torch(tmp_path):
    run_dir = failed_run(tmp_path / "failed")
    code = (
        "import sys; from launch.cli import main; status = main(['report', sys.argv[1], '--out', sys.argv[2]]); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(status)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(run_dir), str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "no torch" in done.stdout and f"report: {(tmp_path / 'r.html').resolve()}" in done.stdout
    assert (tmp_path / "r.html").stat().st_size > 1000


def test_report_command_needs_one_run_or_two_to_compare(tmp_path, capsys):
    assert cli_main(["report"]) == 2
    assert "give a run directory" in capsys.readouterr().err
    run_dir = failed_run(tmp_path / "failed")
    assert cli_main(["report", str(run_dir), "--compare", str(run_dir), str(run_dir)]) == 2
    assert "not both" in capsys.readouterr().err
    assert cli_main(["report", "--compare", str(run_dir), str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
