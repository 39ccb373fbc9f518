"""A run folder is complete and consistent, or says it is not; and a run writes only where nobody else can.

* A launch into a used folder removes everything the earlier run left there (results, figures, report,
  log folders) before it starts, so a failed re-run cannot sit beside an old PASSED report; files that
  are not a run's stay.
* A launch interrupted after its ranks finished leaves ``INCOMPLETE``: the report says so instead of
  calling the workers' metrics a pass.
* A folder another user could write into, or a symbolic link as the folder or under a file's name, is
  refused or replaced, never written through.
* Files are written whole or not at all: a write that fails half-way leaves the earlier file as it was.
* A full disk is said as such ("no space left in <folder>", exit status 4), not as bad input or a traceback.

The workers are replaced by a stub that writes what ranks write; nothing here starts a process.
"""

from __future__ import annotations

import errno
import json
import os
import re

import pytest

import launch
from hyper_parallel.run_files import NoSpaceError, write_atomic
from launch import cli, runs
from launch.processes.run_dirs import INCOMPLETE_FILE, RunDirError
from launch.processes.supervisor import TorchrunResult
from launch.report import build_report, read_run

EARLIER_RUN = {
    "report.html": "<span class='verdict'>PASSED · matches the single-process reference</span>",
    "mesh.png": "png",
    "timeline.svg": "<svg/>",
    "chrome_trace.json": "{}",
    "metrics.json": json.dumps({"ok": True, "losses": [1.0, 0.5]}),
    "summary.json": json.dumps({"ok": True}),
    "trace_rank0.json": json.dumps({"rank": 0, "events": []}),
    "batch.json": "[]",
    ".summary.json.x.partial": "{",
}


def _workers(outcome, error: str = "rank 1 failed: killed by SIGKILL"):
    """A stand-in for the ranks: ``outcome(dirs)`` writes what they would and returns ok or raises."""

    def launch_batch(specs, root, *args) -> TorchrunResult:
        ok = outcome([spec.out for spec in specs])
        return TorchrunResult(ok, 0 if ok else 1, {}, root, None if ok else 1, None if ok else error, False, 0.1, [])

    return launch_batch


def _disk_full_after(monkeypatch, nbytes: int) -> None:
    """Every ``write_atomic`` fails with ENOSPC after writing ``nbytes`` (it writes through ``os.fdopen``)."""
    real_fdopen = os.fdopen

    def fdopen(fd, mode):
        handle = real_fdopen(fd, mode)

        class HalfWriter:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                handle.close()

            def write(self, data):
                handle.write(data[:nbytes])
                handle.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return HalfWriter()

    monkeypatch.setattr(os, "fdopen", fdopen)


def _metrics(ok: bool):
    def write(dirs) -> bool:
        for directory in dirs:
            (directory / "metrics.json").write_text(json.dumps({"ok": ok, "losses": [1.0]}))
        return ok

    return write


def test_a_rerun_into_a_used_folder_keeps_nothing_of_the_earlier_run(tmp_path, monkeypatch):
    out = tmp_path / "m4"
    (out / "torchrun_logs_old" / "pool" / "attempt_0" / "0").mkdir(parents=True)
    for name, text in EARLIER_RUN.items():
        (out / name).write_text(text)
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr(runs, "_launch_batch", _workers(lambda dirs: False))  # the re-run fails, writing nothing
    result = launch.run("M4", steps=2, out=out)
    assert not result.ok
    assert sorted(p.name for p in out.iterdir()) == [".launch.lock", "notes.txt", "summary.json"]
    assert json.loads((out / "summary.json").read_text())["ok"] is False
    page = build_report(out)
    assert "PASSED" not in page and re.search(r"FAILED · rank 1", page)


def test_a_launch_interrupted_after_its_ranks_finished_says_incomplete(tmp_path, monkeypatch):
    out = tmp_path / "m4"

    def finish_then_interrupt(dirs) -> bool:
        _metrics(True)(dirs)
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "_launch_batch", _workers(finish_then_interrupt))
    with pytest.raises(KeyboardInterrupt):
        launch.run("M4", steps=2, out=out)
    assert {"metrics.json", INCOMPLETE_FILE} <= {p.name for p in out.iterdir()}
    assert not (out / "summary.json").exists()
    run = read_run(out)
    assert not run.ok and run.verdict == "INCOMPLETE" and "did not finish" in run.error
    assert "PASSED" not in build_report(out)


def test_a_finished_launch_leaves_no_incomplete_note(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "_launch_batch", _workers(_metrics(True)))
    results = launch.run_many([{"recipe": "M4", "steps": 1}, {"recipe": "M1", "steps": 1}], out=tmp_path / "batch")
    assert all(result.ok for result in results)
    assert not list((tmp_path / "batch").rglob(INCOMPLETE_FILE))
    assert [read_run(result.run_dir).verdict for result in results] == ["PASSED", "PASSED"]


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_an_out_folder_others_can_write_is_refused_before_anything_is_written(tmp_path, monkeypatch, mode):
    monkeypatch.setattr(runs, "_launch_batch", _workers(_metrics(True)))
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, mode)
    with pytest.raises(RunDirError, match=f"{out} is writable by"):
        launch.run("M4", steps=1, out=out)
    assert not list(out.iterdir())


def test_a_symlink_as_the_out_folder_or_its_lock_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "_launch_batch", _workers(_metrics(True)))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunDirError, match="symbolic link"):
        launch.run("M4", steps=1, out=tmp_path / "link")
    out, victim = tmp_path / "m4", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious")
    (out / ".launch.lock").symlink_to(victim)
    with pytest.raises(RunDirError, match="symbolic link there is refused"):
        launch.run("M4", steps=1, out=out)
    assert victim.read_text() == "precious"


def test_a_link_planted_under_a_file_name_is_replaced_not_written_through(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "_launch_batch", _workers(_metrics(True)))
    out, victim = tmp_path / "m4", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious")
    (out / "summary.json").symlink_to(victim)
    assert launch.run("M4", steps=1, out=out).ok
    assert victim.read_text() == "precious"
    assert not (out / "summary.json").is_symlink() and json.loads((out / "summary.json").read_text())["ok"]


def test_a_write_that_fails_half_way_leaves_the_earlier_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text('{"ok": false}')
    _disk_full_after(monkeypatch, 4)
    with pytest.raises(NoSpaceError, match=f"no space left in {tmp_path}"):
        write_atomic(path, '{"ok": true, "losses": [1.0]}')
    assert path.read_text() == '{"ok": false}' and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_full_disk_under_the_cli_says_so_with_its_own_status(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runs, "_launch_batch", _workers(_metrics(True)))
    _disk_full_after(monkeypatch, 4)
    out = tmp_path / "m4"
    assert cli.main(["run", "M4", "--steps", "1", "--out", str(out), "--quiet"]) == cli.EXIT_NO_SPACE == 4
    err = capsys.readouterr().err
    assert err.startswith(f"error: no space left in {out} (No space left on device)") and "Traceback" not in err
    assert [p.name for p in out.iterdir()] == [".launch.lock"]  # nothing half written


def test_ranks_that_ran_out_of_space_fail_the_run_with_its_own_status(tmp_path, monkeypatch, capsys):
    rank_error = (
        "rank 0 failed: exit code 1\nTraceback (most recent call last):\n"
        "hyper_parallel.run_files.NoSpaceError: [Errno 28] no space left in /somewhere (No space left on device)"
    )
    monkeypatch.setattr(runs, "_launch_batch", _workers(lambda dirs: False, rank_error))
    out = tmp_path / "m4"
    assert cli.main(["run", "M4", "--steps", "1", "--out", str(out), "--quiet"]) == cli.EXIT_NO_SPACE
    assert f"no space left in {out}: the ranks could not write their results" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["ok"] is False
