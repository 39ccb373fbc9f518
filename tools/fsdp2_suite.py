"""Run torch's own FSDP2 test suite (``test/distributed/_composable/fsdp/test_fully_shard_*.py`` of the pytorch
repository) on CPU/gloo twice: once as written (torch's ``fully_shard``), once with hyper_parallel's
``fully_shard`` under every name the tests import torch's from. It reports which tests torch passes here (the
runnable ones), which of those ours passes, and why each other one fails with ours (``SUITE_EXPECTATIONS`` of ``tools/fsdp2_suite_expectations.py``).

    .venv/bin/python tools/fsdp2_suite.py /tmp/fsdp_suite [--files frozen,training] [--timeout 900]

The folder holds a copy of torch's test files, fetched by the person running this: the repository ships none of
them. Each file is copied into a scratch folder with the device spellings of a GPU run changed to CPU
(``_rewrite``) and ``tools/fsdp2_suite_patch.py`` imported first; the runs write ``fsdp2_suite.json`` (every
outcome) beside the copies and print the counts. docs/fully_shard.md ("torch's FSDP2 test suite") keeps the
figures and the table of every test ours does not pass; tests/test_fsdp2_suite_doc.py holds that table to
``SUITE_EXPECTATIONS``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPECTATIONS = Path(__file__).resolve().parent / "fsdp2_suite_expectations.py"
PATCH = Path(__file__).resolve().parent / "fsdp2_suite_patch.py"
SIDES = ("torch", "ours")


def _expectations() -> tuple[tuple[str, ...], dict[str, tuple[str, str]], dict[str, str]]:
    """The categories and the tables of ``tools/fsdp2_suite_expectations.py``, loaded by path (this runner is
    run as a script and loaded by path in the tests, so the folder is not always importable)."""
    spec = importlib.util.spec_from_file_location("fsdp2_suite_expectations", EXPECTATIONS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CATEGORIES, module.SUITE_EXPECTATIONS, module.NOT_RUNNABLE_HERE


CATEGORIES, SUITE_EXPECTATIONS, NOT_RUNNABLE_HERE = _expectations()

_REWRITES = (
    (re.compile(r"torch\.accelerator\.current_accelerator\(\)\.type"), '"cpu"'),
    (re.compile(r"torch\.accelerator\.current_accelerator\(\)"), 'torch.device("cpu")'),
    (re.compile(r"torch\.get_device_module\([^()]*\)\.device_count\(\)"), "4"),
    (re.compile(r"torch\.accelerator\.device_count\(\)"), "4"),
    (re.compile(r"torch\.accelerator\.is_available\(\)"), "True"),
    (re.compile(r"device_ids=\[self\.rank\]"), "device_ids=None"),
    (re.compile(r"torch\.cuda\.device_count\(\)"), "4"),
    (re.compile(r"\.cuda\(\)"), ".cpu()"),
    (re.compile(r"([\"'])cuda\1"), '"cpu"'),
    (re.compile(r"\btest_compiled_fsdp\b"), "compiled_fsdp_test"),
    (re.compile(r"torch\.distributed\._tensor\.debug\b"), "torch.distributed.tensor.debug"),
    (re.compile(r"DISTRIBUTED_BACKEND != \"nccl\""), "False"),
    (re.compile(r'(run_process_no_exception\(\s*f?""")\\\n'), r"\1import _hp_suite_patch  # noqa\n"),
)
"""GPU spellings -> CPU: the accelerator (None on a CPU build), the device count and whether there is one
(gloo ranks are not devices: a world size of "0 if no accelerator" would run no rank and pass vacuously),
DDP's ``device_ids`` (a CPU module takes None), and the older files' literal ``"cuda"`` / ``.cuda()``, and
their ``test_compiled_fsdp`` (``compiled_fsdp_test`` since) and ``torch.distributed._tensor.debug`` (now
``torch.distributed.tensor.debug``), and the skips of tests "requiring NCCL" (gloo reduces bf16 too). The code a
test runs in a fresh interpreter (``run_process_no_exception``, the ``logging`` file) imports the patch first too,
so that process gets ours on the ``ours`` side (its environment carries the side and the scratch folder)."""


def _rewrite(source: str) -> str:
    """The test file as it runs here: the patch imported first, the device spellings changed, every test class
    capped at 4 ranks."""
    for pattern, replacement in _REWRITES:
        source = pattern.sub(replacement, source)
    return (
        "import _hp_suite_patch  # noqa\n"
        + source
        + "\n\nimport _hp_suite_patch as _hp\n_hp.cap_world_sizes(globals())\n"
    )


def prepare(suite: Path, scratch: Path, names: list[str] | None) -> list[Path]:
    """Copies of torch's test files (all ``test_fully_shard_*.py``, or those ``names`` pick) in ``scratch``."""
    sources = sorted(suite.glob("test_fully_shard_*.py"))
    if names:
        sources = [s for s in sources if any(s.stem == f"test_fully_shard_{n}" or s.stem == n for n in names)]
    if not sources:
        raise ValueError(f"no test_fully_shard_*.py in {suite} (matching {names}): pass the folder of torch's tests")
    shutil.copy(PATCH, scratch / "_hp_suite_patch.py")
    for helper in suite.glob("_*.py"):  # helpers some test files import from their own folder
        shutil.copy(helper, scratch / helper.name)
    copies = []
    for source in sources:
        copy = scratch / source.name
        copy.write_text(_rewrite(source.read_text()))
        copies.append(copy)
    return copies


_ERROR_LINE = re.compile(r"^(?:E\s+)?((?:\w+\.)*\w*(?:Error|Exception|Unsupported)\b:?.*)$")
_TEST_FRAME = re.compile(r'File "[^"]*/(test_fully_shard_\w+\.py)", line (\d+)')


def _reason(text: str) -> str:
    """The error a failure ended in and the line of torch's test that raised it: the ranks' traceback is nested
    in the junit text, so the last error line and the last frame in a test file are the informative ones."""
    errors = [m.group(1).strip() for line in text.splitlines() if (m := _ERROR_LINE.match(line.strip()))]
    errors = [e for e in errors if not e.startswith("RuntimeError: Process")] or errors
    frames = _TEST_FRAME.findall(text)
    where = f" ({frames[-1][0]}:{frames[-1][1]})" if frames else ""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return ((errors[-1] if errors else first)[:240] + where).strip()


def _outcomes(junit: Path, file_stem: str) -> dict[str, dict]:
    """``file::Class::test`` -> {"outcome": passed|failed|skipped, "message": why, for the others}."""
    results = {}
    if not junit.exists():
        return results
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        test_id = f"{file_stem}::{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
                message = _reason(f"{child.get('message') or ''}\n{child.text or ''}")
                break
        results[test_id] = {"outcome": outcome, "message": message}
    return results


_VERBOSE_LINE = re.compile(r"^(test_fully_shard_\w+)\.py::(\w+)::(\w+) (PASSED|FAILED|ERROR|SKIPPED)")


def _outcomes_so_far(log: Path) -> dict[str, dict]:
    """The outcomes pytest's verbose log names, for a file stopped before its junit report was written."""
    results = {}
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if match := _VERBOSE_LINE.match(line):
            stem, cls, name, word = match.groups()
            outcome = {"PASSED": "passed", "SKIPPED": "skipped"}.get(word, "failed")
            results[f"{stem}::{cls}::{name}"] = {"outcome": outcome, "message": "" if outcome == "passed" else word}
    return results


POISONED = "Previous test failed"
"""The skip message of torch's ``MultiProcContinuousTest`` (``FSDPTestContinuous``) for every test of a class
after one failed: such a test is rerun alone (``run_file``), so one failure does not hide the others."""


def _run_pytest(copy: Path, side: str, tag: str, targets: list[str], timeout: float, test_timeout: float):
    """pytest on ``targets`` (the file, or node ids in it) under one side; the junit report, or ``None`` with
    the log's outcomes when it outlived ``timeout``."""
    junit, log = copy.parent / f"{copy.stem}.{tag}.xml", copy.parent / f"{copy.stem}.{tag}.log"
    junit.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(copy.parent), str(ROOT)]))
    env["HP_FSDP2_SUITE_SIDE"] = side
    env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(int(test_timeout))  # the ranks' wait, 300 s by default
    command = [sys.executable, "-m", "pytest", *targets, "-v", "-p", "no:cacheprovider", "--rootdir", str(copy.parent)]
    command += ["-o", "addopts=", "--timeout", str(int(test_timeout)), f"--junitxml={junit}"]
    with log.open("w") as out:
        try:
            subprocess.run(command, cwd=copy.parent, env=env, timeout=timeout, stdout=out, stderr=out, check=False)
        except subprocess.TimeoutExpired:
            return None, _outcomes_so_far(log)
    return _outcomes(junit, copy.stem) or _outcomes_so_far(log), {}


def run_file(copy: Path, side: str, timeout: float, test_timeout: float) -> dict[str, dict]:
    """One test file under one side; a file that outlives ``timeout`` keeps the outcomes its log reached and
    counts the rest as failed (``file::*``). Tests a continuous class skipped after an earlier failure
    (``POISONED``) are rerun one at a time."""
    results, so_far = _run_pytest(copy, side, side, [str(copy)], timeout, test_timeout)
    if results is None:
        so_far[f"{copy.stem}::*"] = {"outcome": "failed", "message": f"file timed out after {timeout:.0f} s"}
        return so_far
    for test_id in [t for t, r in results.items() if r["outcome"] == "skipped" and POISONED in r["message"]]:
        node = f"{copy}::{test_id.split('::', 1)[1]}"
        alone, so_far = _run_pytest(copy, side, f"{side}.alone", [node], test_timeout + 60, test_timeout)
        results[test_id] = (alone or so_far).get(test_id, {"outcome": "failed", "message": "rerun alone: no outcome"})
    return results


def run_all(
    copies: list[Path], sides: list[str], timeout: float, jobs: int, test_timeout: float = 300
) -> dict[str, dict[str, dict]]:
    """Every (side, file) pair, ``jobs`` at a time (each test starts its own ranks: 2 jobs keep 2 cores busy)."""
    runs: dict[str, dict[str, dict]] = {side: {} for side in sides}
    pairs = [(side, copy) for copy in copies for side in sides]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_file, copy, side, timeout, test_timeout): (side, copy) for side, copy in pairs}
        for future in as_completed(futures):
            side, copy = futures[future]
            runs[side].update(future.result())
            passed = sum(1 for t, r in runs[side].items() if t.startswith(copy.stem) and r["outcome"] == "passed")
            print(f"{side:5} {copy.stem}: {passed} passed", flush=True)
    return runs


def compare(runs: dict[str, dict[str, dict]]) -> dict:
    """The counts, and every runnable test ours fails with its category from ``SUITE_EXPECTATIONS``."""
    torch_passed = sorted(t for t, r in runs["torch"].items() if r["outcome"] == "passed")
    ours = runs.get("ours", {})
    ours_failed = [t for t in torch_passed if ours.get(t, {}).get("outcome") != "passed"]
    failing = {}
    for test in ours_failed:
        category, reason = SUITE_EXPECTATIONS.get(test, ("unclassified", ""))
        failing[test] = {"category": category, "reason": reason, "message": ours.get(test, {}).get("message", "")}
    by_category = {c: sum(1 for f in failing.values() if f["category"] == c) for c in (*CATEGORIES, "unclassified")}
    return {
        "collected": len(runs["torch"]),
        "runnable": len(torch_passed),
        "ours_passed": len(torch_passed) - len(ours_failed),
        "failing_by_category": by_category,
        "failing": failing,
        "not_runnable": {t: r["message"] for t, r in sorted(runs["torch"].items()) if r["outcome"] != "passed"},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", type=Path, help="folder holding torch's test_fully_shard_*.py")
    parser.add_argument("--files", default="", help="comma-separated file names (frozen,training,...); all if empty")
    parser.add_argument("--sides", default="torch,ours", help="torch, ours or both (torch,ours)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per test file and side")
    parser.add_argument("--test-timeout", type=float, default=300, help="seconds per test (pytest-timeout)")
    parser.add_argument("--jobs", type=int, default=2, help="test files run at once")
    parser.add_argument("--scratch", type=Path, default=None, help="where the copies and results go")
    parser.add_argument("--merge", type=Path, nargs="*", default=None, help="fsdp2_suite.json files to combine")
    args = parser.parse_args(argv)
    if args.merge is not None:
        return report(merge_results(args.merge), args.scratch)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="fsdp2-suite-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        copies = prepare(args.suite, scratch, [n for n in args.files.split(",") if n])
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    runs = run_all(copies, args.sides.split(","), args.timeout, args.jobs, args.test_timeout)
    return report(runs, scratch)


def merge_results(paths: list[Path]) -> dict[str, dict[str, dict]]:
    """The runs of several ``fsdp2_suite.json`` (one per group of test files), as one."""
    runs: dict[str, dict[str, dict]] = {}
    for path in paths:
        for side, outcomes in json.loads(path.read_text())["runs"].items():
            runs.setdefault(side, {}).update(outcomes)
    return runs


def report(runs: dict[str, dict[str, dict]], scratch: Path | None) -> int:
    """Prints the counts and every runnable test ours fails; writes them beside the copies."""
    summary = compare(runs) if "torch" in runs else {}
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / "fsdp2_suite.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
        print(f"results: {scratch / 'fsdp2_suite.json'}")
    if summary:
        print(json.dumps({k: v for k, v in summary.items() if k not in ("failing", "not_runnable")}, indent=1))
        for test, failure in summary["failing"].items():
            print(f"| `{test}` | {failure['category']} | {failure['reason'] or failure['message']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
