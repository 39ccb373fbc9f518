"""Every bad input of the table (tests/bad_input_cases.py and bad_input_api_cases.py: 500+ over the CLI, ``launch.run`` / ``run_many`` /
``torchrun`` / ``validate`` / ``write_report``, the widgets, ``%%torchrun``, the planner and the environment
variables) is refused cleanly, and the valid controls are accepted.

Cleanly: the CLI exits 2 with ``error:`` / argparse's message naming the rule and no traceback; Python raises
``ValueError`` (or the documented ``RunDirError``) naming it; the magic prints it and returns; within 2 s of the process's CPU (not wall time: under load the ranks of other tests queue for the cores); no
worker started (every way a process group could start is replaced by a stub that records it); nothing
written in the case's cwd, scratch folder, TMPDIR or the hostile files. The CLI runs in-process
(``launch.cli.main``), so the whole table costs seconds, not a Python start per case.

``python tests/test_bad_input_table.py`` prints the verdicts counted by kind and entry point (what the
reliability review tallied).
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import re
import signal
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from bad_input_api_cases import API_CASES, MAGIC_NAMESPACE
from bad_input_cases import CLI_CASES, PLAN_CASES, Case, Paths, make_fixtures

from launch import cli
from launch.notebook import magic

CASES = [*CLI_CASES, *PLAN_CASES, *API_CASES]
# A refusal must cost at most this much of the process's own CPU (all its threads): CPU seconds, not wall seconds,
# so that ranks queueing for 2 shared cores under load cannot make a quick refusal read as slow.
CPU_SECONDS_PER_CASE = 2.0
HANG_SECONDS = 60  # wall clock: a case still running then is hung, whatever the load


class WouldLaunch(BaseException):
    """A stub of a process-group start was reached (BaseException: no ``except Exception`` hides it)."""


class TooSlow(BaseException):
    """A case ran past ``HANG_SECONDS``."""


@contextlib.contextmanager
def nothing_starts(launched: list[str]) -> Iterator[None]:
    """Every way the launcher starts workers records the attempt and raises ``WouldLaunch``."""
    import launch.notebook.workbook
    import launch.processes.pool
    import launch.processes.supervisor
    import launch.runs

    def stub(name: str):
        def refuse(*args, **kwargs):
            launched.append(name)
            raise WouldLaunch(name)

        return refuse

    launch.processes.pool.shutdown_pool()  # a pool another test left warm would run a launch without _start
    targets = [
        (launch.processes.pool.Pool, "_start"),
        (launch.processes.supervisor, "_launch"),
        (launch.processes.supervisor, "start_agent"),
        (launch.runs, "torchrun_claimed"),
        (launch.notebook.workbook, "WorkbookKernel"),
        (launch.notebook.workbook, "_run_in_workers"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets]
    for owner, name in targets:
        setattr(owner, name, stub(f"{getattr(owner, '__name__', owner)}.{name}"))
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


@contextlib.contextmanager
def sandbox(case: Case, paths: Paths) -> Iterator[None]:
    """The case's cwd, scratch and TMPDIR inside its own folder, its environment variables set."""
    for name in ("cwd", "scratch", "tmp"):
        (paths.box / name).mkdir(mode=0o700)
    env = {
        "HYPER_PARALLEL_SCRATCH": str(paths.box / "scratch"),
        "TMPDIR": str(paths.box / "tmp"),
        **{k: v.format(fx=paths.fx, box=paths.box) for k, v in case.env.items()},
    }
    saved_env = {name: os.environ.get(name) for name in env}
    saved_cwd, saved_tempdir = os.getcwd(), tempfile.tempdir
    os.environ.update(env)
    os.chdir(paths.box / "cwd")
    tempfile.tempdir = None
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        tempfile.tempdir = saved_tempdir
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _files(*roots: Path) -> set[tuple[str, int]]:
    found = set()
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                path = Path(folder, name)
                with contextlib.suppress(OSError):
                    found.add((str(path), path.lstat().st_size if name in files else -1))
    return found


def _call(case: Case, paths: Paths) -> tuple[object, str]:
    """Run the case; (its outcome: an exit status, a raised exception or a return value, its stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            if case.kind == "cli":
                outcome = cli.main([arg.format(fx=paths.fx, box=paths.box) for arg in case.argv])
            elif case.kind == "magic":
                line, cell = case.call(paths)
                outcome = magic.torchrun_magic(line, cell)
            else:
                outcome = case.call(paths)
        except SystemExit as error:
            outcome = error.code
        except (WouldLaunch, TooSlow):
            raise
        except BaseException as error:
            outcome = error
            print("".join(traceback.format_exception(error)), file=err)
    return outcome, err.getvalue()


def verdict(case: Case, paths: Paths) -> tuple[str, str]:
    """('clean', '') or (what went wrong, the evidence): 'launch', 'slow', 'traceback', 'accepted',
    'vague' (refused without naming the rule) or 'wrote'."""
    launched: list[str] = []
    before = _files(paths.box, paths.fx)

    def too_slow(*_):
        raise TooSlow

    outer, _ = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's alarm, restored after
    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    start, cpu_start = time.monotonic(), time.process_time()
    try:
        with sandbox(case, paths), nothing_starts(launched):
            outcome, err = _call(case, paths)
    except WouldLaunch:
        return "launch", launched[0]
    except TooSlow:
        return "slow", f"still running after {HANG_SECONDS} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001))
    cpu_seconds = time.process_time() - cpu_start
    if launched:
        return "launch", launched[0]
    new = sorted(path for path, _ in _files(paths.box, paths.fx) - before)
    new = [path for path in new if not path.endswith(("/cwd", "/scratch", "/tmp"))]
    message = str(outcome) if isinstance(outcome, BaseException) else err
    if case.kind == "cli":
        if outcome == 0:
            return "accepted", f"exit 0: {err[-300:]}"
        if outcome != cli.EXIT_INVALID or "Traceback" in err:
            return "traceback", f"exit {outcome!r}: {err[-600:]}"
    elif case.kind == "magic":
        if isinstance(outcome, BaseException):
            return "traceback", f"{type(outcome).__name__}: {str(outcome)[:300]}"
        if "Traceback" in err:
            return "traceback", err[-600:]
    elif not isinstance(outcome, BaseException):
        return "accepted", f"returned {type(outcome).__name__}"
    elif not isinstance(outcome, case.errors):
        return "traceback", f"{type(outcome).__name__}: {str(outcome)[:300]}"
    if not re.search(case.rule, message):
        return "vague", message[-400:]
    if new:
        return "wrote", ", ".join(new[:3])
    if cpu_seconds > CPU_SECONDS_PER_CASE:
        return "slow", f"{cpu_seconds:.1f} s of CPU ({time.monotonic() - start:.1f} s wall)"
    return "clean", ""


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory) -> Path:
    fx = tmp_path_factory.mktemp("hostile")
    make_fixtures(fx)
    return fx


@pytest.fixture(autouse=True)
def kernel_variables(monkeypatch):
    monkeypatch.setattr(magic, "_user_namespace", lambda: MAGIC_NAMESPACE)


def test_the_table_covers_every_entry_point():
    entries = collections.Counter(case.entry.split()[0] for case in CASES)
    assert len(CASES) >= 500, len(CASES)
    assert {"cli", "launch.run", "run_many", "launch.torchrun", "widgets", "%%torchrun", "environment"} <= set(entries)
    subcommands = {case.argv[0] for case in CASES if case.kind == "cli"}
    assert set(cli.SUBCOMMANDS) - {"list"} <= subcommands


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_each_bad_input_is_refused_cleanly(case, hostile_files, tmp_path):
    kind, evidence = verdict(case, Paths(hostile_files, tmp_path))
    assert kind == "clean", evidence


CONTROLS = [  # valid input: validation accepts it; a launch is where the stubs stop it
    (Case("cli check", "check --world 8 --tp 2", "", "cli", argv=("check", "--world", "8", "--tp", "2")), "accepted"),
    (Case("cli plan", "plan --world 8 --tp 2", "", "cli", argv=("plan", "--world", "8", "--tp", "2")), "accepted"),
    (Case("launch.validate", "M4", "", "python", call=lambda p: __import__("launch").validate("M4")), "accepted"),
    (Case("launch.run", "M4", "", "python", call=lambda p: __import__("launch").run("M4", steps=1)), "launch"),
    (Case("cli run", "run M4", "", "cli", argv=("run", "M4", "--steps", "1", "--out", "{box}/r")), "launch"),
    (Case("%%torchrun", "-n 2", "", "magic", call=lambda p: ("-n 2 --out values --send d2", "rank")), "launch"),
]  # fmt: skip


@pytest.mark.parametrize("control, expected", CONTROLS, ids=[c.id for c, _ in CONTROLS])
def test_valid_input_passes_validation(control, expected, hostile_files, tmp_path, monkeypatch):
    """The harness can tell: valid input is accepted, and one that would start workers reaches the stub."""
    monkeypatch.setattr(magic, "_user_namespace", lambda: {"d2": {"a": [1, 2]}})
    assert verdict(control, Paths(hostile_files, tmp_path))[0] == expected


def main() -> None:
    """Print every case that is not refused cleanly and the tally by kind and entry point."""
    magic._user_namespace = lambda: MAGIC_NAMESPACE
    tally, by_entry = collections.Counter(), collections.defaultdict(collections.Counter)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as root:
        fx = Path(root, "hostile")
        fx.mkdir()
        make_fixtures(fx)
        for index, case in enumerate(CASES):
            box = Path(root, f"case{index}")
            box.mkdir()
            kind, evidence = verdict(case, Paths(fx, box))
            tally[kind] += 1
            by_entry[case.entry.split()[0]][kind] += 1
            if kind != "clean":
                print(f"{kind:9} {case.id}\n          {evidence[-300:]!r}", flush=True)
    print(f"\n{len(CASES)} cases in {time.monotonic() - start:.1f} s: {dict(tally)}")
    for entry, counts in sorted(by_entry.items()):
        print(f"  {entry:16} {counts['clean']}/{sum(counts.values())} clean  {dict(counts)}")


if __name__ == "__main__":
    main()
