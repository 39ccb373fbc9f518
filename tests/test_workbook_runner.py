"""``make workbook``'s runner (``launch.notebook.workbook``): executed notebooks and a report each, a failing
notebook reported, two notebooks at a time printed in reading order, Ctrl-C leaving no kernel, and a kept
kernel starting each notebook afresh on the same warm pool without leaking clients.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from launch.notebook.workbook import NOTEBOOKS_DIR, SOLO, execute_notebook, run_workbook


def test_run_workbook_writes_executed_notebooks_and_reports_each(tmp_path, capsys):
    assert run_workbook(tmp_path, only=["90"]) == 0
    out = capsys.readouterr().out
    [root] = list(tmp_path.iterdir())
    assert (root / "90_negative_cases.ipynb").exists()
    assert "OK     90_negative_cases" in out and f"workbook written to {root}" in out


def test_run_workbook_fails_when_a_notebook_fails(tmp_path, capsys):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("figures_dir = None\nruns_dir = None"),
            nbformat.v4.new_code_cell("assert 1 + 1 == 3, 'arithmetic'"),
        ]
    )
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "50_broken.ipynb")
    assert run_workbook(tmp_path / "runs", notebooks_dir=folder) == 1
    out = capsys.readouterr().out
    assert "FAILED 50_broken" in out and "AssertionError: arithmetic" in out and "failed: 50_broken" in out
    assert NOTEBOOKS_DIR.name == "notebooks"


def test_run_workbook_runs_two_at_a_time_prints_in_reading_order_and_times_alone(tmp_path, capsys):
    """jobs=2: the first two notebooks overlap in time, their lines come in reading order (the slow first
    one before the fast failing second one), and the SOLO notebook starts after both ended."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    bodies = {
        "10_slow": "time.sleep(3)",
        "11_fails": "raise RuntimeError('second')",
        SOLO[0]: "",
    }
    for name, body in bodies.items():
        stamp = "import json, pathlib, time\nstart = time.time()\n"
        record = "pathlib.Path(runs_dir).mkdir(parents=True, exist_ok=True)\n"
        record += "(pathlib.Path(runs_dir) / 'times.json').write_text(json.dumps([start, time.time()]))\n"
        cells = [nbformat.v4.new_code_cell("figures_dir = None\nruns_dir = None"), nbformat.v4.new_code_cell(stamp)]
        cells.append(
            nbformat.v4.new_code_cell(
                f"try:\n    {body or 'pass'}\nfinally:\n" + "".join(f"    {line}\n" for line in record.splitlines())
            )
        )
        nb = nbformat.v4.new_notebook(cells=cells)
        nb.cells[0].metadata["tags"] = ["parameters"]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / f"{name}.ipynb")
    assert run_workbook(tmp_path / "runs", notebooks_dir=folder, jobs=2) == 1
    out = capsys.readouterr().out
    lines = [line.split()[1] for line in out.splitlines() if line.startswith(("OK", "FAILED"))]
    assert lines == ["10_slow", "11_fails", SOLO[0]], out
    [root] = list((tmp_path / "runs").iterdir())
    times = {name: json.loads((root / "runs" / name / "times.json").read_text()) for name in bodies}
    assert times["11_fails"][0] < times["10_slow"][1]  # started while the slow one was still running
    assert times[SOLO[0]][0] >= max(times["10_slow"][1], times["11_fails"][1])  # alone, last


def test_ctrl_c_stops_a_workbook_of_two_at_a_time_and_leaves_no_kernel(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the process group) while two notebooks run: the workbook stops at
    once instead of waiting for them and starting the rest, and no kernel outlives it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    folder = tmp_path / "notebooks"
    folder.mkdir()
    for name in ("10_first", "11_second", "12_third"):
        nb = nbformat.v4.new_notebook(
            cells=[
                nbformat.v4.new_code_cell("figures_dir = None\nruns_dir = None"),
                nbformat.v4.new_code_cell(
                    "import os, pathlib, time\npathlib.Path(runs_dir).mkdir(parents=True)\n"
                    "(pathlib.Path(runs_dir) / 'pid').write_text(str(os.getpid()))\n"
                    "time.sleep(120)"
                ),
            ]
        )
        nb.cells[0].metadata["tags"] = ["parameters"]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / f"{name}.ipynb")
    code = (
        "from launch.notebook.workbook import run_workbook\n"
        f"run_workbook({str(tmp_path / 'runs')!r}, notebooks_dir={str(folder)!r}, jobs=2)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    try:
        deadline = time.monotonic() + 120
        while len(list((tmp_path / "runs").rglob("pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        kernels = [int(p.read_text()) for p in (tmp_path / "runs").rglob("pid")]
        assert len(kernels) == 2, "the two first notebooks did not start"
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)  # before: it waited for both and then ran the third
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(5)
    assert not [k for k in kernels if psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE]
    assert not list((tmp_path / "runs").rglob("12_third"))


def _notebook(folder: Path, name: str, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("figures_dir = None\nruns_dir = None")])
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.cells.extend(nbformat.v4.new_code_cell(source) for source in cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.distributed
def test_a_kept_kernel_starts_each_notebook_afresh_but_keeps_the_warm_pool(tmp_path):
    """make workbook's kernel (WorkbookKernel): the second notebook sees none of the first one's names, in
    the kernel or on the ranks, counts its cells from 1 and runs on the same warm workers, although it asks
    for more ranks than the first (the pool started with POOL_RANKS); after a notebook that failed, the
    kernel is a new one."""
    from launch.notebook.workbook_kernel import POOL_RANKS, WorkbookKernel

    folder = tmp_path / "notebooks"
    folder.mkdir()
    workers = "import launch.processes.pool as pool\nsorted(pool.current().worker_pids.values())"
    first = _notebook(folder, "a", "%load_ext launch", "kept = 1", "%%torchrun -n 2\non_ranks = rank", workers)
    second = _notebook(
        folder,
        "b",
        "%load_ext launch",
        "assert 'kept' not in dir(), 'a name of the first notebook'",
        f"%%torchrun -n {POOL_RANKS}\n'on_ranks' in dir()",
        workers,
        "import os\nos.getpid()",
    )
    failing = _notebook(folder, "c", "import os\nprint(os.getpid())\nraise RuntimeError('fails')")
    after = _notebook(folder, "d", "import os\nos.getpid()")
    with WorkbookKernel() as kernel:
        results = [
            execute_notebook(path, tmp_path / path.name, kernel=kernel) for path in (first, second, failing, after)
        ]
    assert [ok for ok, _ in results] == [True, True, False, True], results
    a, b, c, d = (nbformat.read(tmp_path / f"{name}.ipynb", as_version=4) for name in "abcd")

    def value(nb, source: str) -> str:
        cell = next(cell for cell in nb.cells if cell.source == source)
        return next(o["data"]["text/plain"] for o in cell.outputs if "text/plain" in o.get("data", {}))

    on_ranks = value(b, f"%%torchrun -n {POOL_RANKS}\n'on_ranks' in dir()")
    assert on_ranks == repr([False] * POOL_RANKS), "a rank name reached b"
    assert value(a, workers) == value(b, workers) != "[]", "the warm workers were restarted"
    assert len(value(a, workers).split(",")) == POOL_RANKS  # a's 2-rank cell started them all
    assert [cell.execution_count for cell in b.cells if cell.cell_type == "code"][0] == 1
    pid_c = next(o["text"].strip() for cell in c.cells for o in cell.get("outputs", []) if o.get("name") == "stdout")
    assert value(b, "import os\nos.getpid()") == pid_c != value(d, "import os\nos.getpid()")


@pytest.mark.distributed
def test_the_solo_notebook_finds_its_pool_warm_and_runs_alone(tmp_path, capsys):
    """jobs=2: the SOLO notebook's kernel started its POOL_RANKS workers while the last shared notebook ran
    (their processes are older than the solo notebook's first cell, and no run has used them yet), and its
    cells ran only after every shared notebook had ended."""
    from launch.notebook.workbook_kernel import POOL_RANKS

    folder = tmp_path / "notebooks"
    folder.mkdir()
    record = "import json, pathlib\npathlib.Path(runs_dir).mkdir(parents=True, exist_ok=True)\n"
    record += "(pathlib.Path(runs_dir) / 'seen.json').write_text(json.dumps(seen))"
    _notebook(
        folder, "10_slow", "import time\nstart = time.time()\ntime.sleep(6)", "seen = [start, time.time()]", record
    )
    _notebook(folder, "11_quick", "import time\nseen = [time.time(), time.time()]", record)
    probe = (
        "import time, psutil\nimport launch.processes.pool as pool\nstart = time.time()\np = pool.current()\n"
        "seen = [start, p.alive, p.size, p.runs, max(psutil.Process(pid).create_time() for pid in p.worker_pids.values())]"
    )
    _notebook(folder, SOLO[0], probe, record)
    assert run_workbook(tmp_path / "runs", notebooks_dir=folder, jobs=2) == 0, capsys.readouterr().out
    [root] = list((tmp_path / "runs").iterdir())
    seen = {
        name: json.loads((root / "runs" / name / "seen.json").read_text()) for name in ("10_slow", "11_quick", SOLO[0])
    }
    start, alive, size, runs, youngest_worker = seen[SOLO[0]]
    assert (alive, size, runs) == (True, POOL_RANKS, 0)
    assert youngest_worker < start  # started before the notebook, not by it
    assert start >= max(seen["10_slow"][1], seen["11_quick"][1])  # alone, last


def test_a_kept_kernel_leaves_no_client_open_between_notebooks(tmp_path):
    """nbclient leaves its kernel client open when it does not own the kernel (12 fds and a heartbeat thread
    per notebook, measured); a workbook worker runs eight notebooks or more, so WorkbookKernel closes them.
    Garbage is collected before each count: sockets of an earlier test's kernels (the solo kernel of
    ``run_workbook`` lives in this process) close when their objects are collected, which made the count
    drop by 3 mid-loop under the full suite; so no count may grow past the second notebook's (a client left
    open adds 12 per notebook), and the threads stay the same."""
    import gc
    import os
    import threading

    from launch.notebook.workbook_kernel import WorkbookKernel

    path = _notebook(tmp_path, "tiny", "x = 1")
    held = []
    with WorkbookKernel() as kernel:
        for _ in range(6):
            assert execute_notebook(path, tmp_path / "out.ipynb", kernel=kernel) == (True, "")
            gc.collect()
            held.append((len(os.listdir("/proc/self/fd")), threading.active_count()))
    assert all(fds <= held[1][0] and threads == held[1][1] for fds, threads in held[2:]), held
