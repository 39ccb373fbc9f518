"""Run torch's own FSDP2 test suite (``test/distributed/_composable/fsdp/test_fully_shard_*.py`` of the pytorch
repository) on CPU/gloo twice: once as written (torch's ``fully_shard``), once with hyper_parallel's
``fully_shard`` under every name the tests import torch's from. It reports which tests torch passes here (the
runnable ones), which of those ours passes, and why each other one fails with ours (``SUITE_EXPECTATIONS``).

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
PATCH = Path(__file__).resolve().parent / "fsdp2_suite_patch.py"
SIDES = ("torch", "ours")
CATEGORIES = ("behaviour", "internals", "refused", "not runnable here")
"""behaviour: a difference a user sees (a bug of ours); internals: the test reads or patches FSDP2's private
state (``FSDPParamGroup``, ``FSDPParam``, ``_fsdp_collectives``); refused: a documented refusal of ours
(docs/fully_shard.md's table); not runnable here: fails with torch's own ``fully_shard`` on CPU/gloo too."""

_F, _T = "test_fully_shard_frozen::TestFullyShardFrozen", "test_fully_shard_training"
SUITE_EXPECTATIONS: dict[str, tuple[str, str]] = {
    f"{_F}::test_train_mixed_requires_grad_per_group": (
        "internals",
        "counts calls of FSDP2's private RegisterPostBackwardFunction.backward (losses and sharded parameters "
        "equal DDP's first)",
    ),
    f"{_F}::test_train_mixed_requires_grad_across_groups": (
        "internals",
        "counts calls of FSDP2's private RegisterPostBackwardFunction.backward (losses equal DDP's)",
    ),
    f"{_T}::TestFullyShardRegisteredParams::test_modules_to_run_forward_empty_for_single_module": (
        "internals",
        "reads FSDPState._modules_to_run_forward",
    ),
    f"{_T}::TestFullyShard1DTrainingCore::test_train_parity_multi_group_cpu_offload_eager": (
        "refused",
        "offload_policy=CPUOffloadPolicy() is refused with NotImplementedError",
    ),
    f"{_T}::TestFullyShard1DTrainingCompose::test_partial_group_reshard_toggle": (
        "internals",
        "reads FSDPParamGroup.is_unsharded through _get_fsdp_state()._fsdp_param_group",
    ),
    f"{_T}::TestFullyShard1DTrainingCompose::test_train_parity_with_activation_checkpointing": (
        "refused",
        "its mem_eff grouping calls set_unshard_in_backward(False), refused with NotImplementedError",
    ),
    f"{_T}::TestFullyShardSharedParams::test_shared_params_separate_fsdp_groups_error": (
        "refused",
        "ours refuses the second unit holding the tied weight when fully_shard is applied (ValueError, FSDP2's "
        "words), FSDP2 at the first forward, outside the test's assertRaises",
    ),
    f"{_T}::TestFullyShardGradientAccumulation::test_gradient_accumulation": (
        "internals",
        "counts c10d reduce-scatter ops: on gloo ours reduce-scatters with an all-to-all "
        "(hyper_parallel/gloo_sum.py), bit-equal; its CPUOffloadPolicy subtests are refused too",
    ),
    f"{_T}::TestFullyShardHSDPTraining::test_train_parity_hsdp": (
        "refused",
        "every subtest passes offload_policy=CPUOffloadPolicy(), refused with NotImplementedError",
    ),
    f"{_T}::TestFullyShardShareCommContext::test_share_comm_context": (
        "internals",
        "patches FSDP2's private foreach_all_gather / foreach_reduce and counts the streams they get",
    ),
}
"""``file::Class::test`` of each runnable test ours fails -> (category, reason), as measured (docs/fully_shard.md
lists the same); a failure not listed here is reported as "unclassified"."""

NOT_RUNNABLE_HERE: dict[str, str] = {
    "test_fully_shard_clip_grad_norm_::TestClipGradNormWorldSize4::test_clip_grad_norm_2d": (
        "on CPU, DTensor has no sharding strategy for aten._scaled_dot_product_flash_attention_for_cpu (TP "
        "attention; torch's own fully_shard fails it too)"
    ),
    f"{_T}::TestFullyShardCudaGraph::test_two_layer_fully_shard_cudagraph": "skipped: needs CUDA graphs",
    f"{_T}::TestFullyShardHSDP3DTraining::test_3d_mlp_with_nd_mesh": "needs 8 ranks (a 2x2x2 mesh); capped at 4 here",
    f"{_T}::TestFullyShardNDTraining::test_shard_placement_fn_tp_ep": (
        "on CPU, DTensor has no sharding strategy for aten._scaled_dot_product_flash_attention_for_cpu (TP "
        "attention; torch's own fully_shard fails it too)"
    ),
}
"""Tests torch's own ``fully_shard`` does not pass on CPU/gloo with at most 4 ranks, and why (docs/fully_shard.md)."""

_REWRITES = (
    (re.compile(r"torch\.accelerator\.current_accelerator\(\)\.type"), '"cpu"'),
    (re.compile(r"torch\.accelerator\.current_accelerator\(\)"), 'torch.device("cpu")'),
    (re.compile(r"torch\.get_device_module\([^()]*\)\.device_count\(\)"), "4"),
    (re.compile(r"torch\.accelerator\.device_count\(\)"), "4"),
    (re.compile(r"device_ids=\[self\.rank\]"), "device_ids=None"),
    (re.compile(r"torch\.cuda\.device_count\(\)"), "4"),
    (re.compile(r"\.cuda\(\)"), ".cpu()"),
    (re.compile(r"([\"'])cuda\1"), '"cpu"'),
    (re.compile(r"\btest_compiled_fsdp\b"), "compiled_fsdp_test"),
    (re.compile(r"torch\.distributed\._tensor\.debug\b"), "torch.distributed.tensor.debug"),
)
"""GPU spellings -> CPU: the accelerator (None on a CPU build), the device count (gloo ranks are not devices),
DDP's ``device_ids`` (a CPU module takes None), and the older files' literal ``"cuda"`` / ``.cuda()``, and
their ``test_compiled_fsdp`` (``compiled_fsdp_test`` since) and ``torch.distributed._tensor.debug`` (now
``torch.distributed.tensor.debug``)."""


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


def run_file(copy: Path, side: str, timeout: float, test_timeout: float) -> dict[str, dict]:
    """One test file under one side; a file that outlives ``timeout`` keeps the outcomes its log reached and
    counts the rest as failed (``file::*``)."""
    junit, log = copy.parent / f"{copy.stem}.{side}.xml", copy.parent / f"{copy.stem}.{side}.log"
    junit.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(copy.parent), str(ROOT)]))
    env["HP_FSDP2_SUITE_SIDE"] = side
    command = [sys.executable, "-m", "pytest", str(copy), "-v", "-p", "no:cacheprovider", "--rootdir", str(copy.parent)]
    command += ["-o", "addopts=", "--timeout", str(int(test_timeout)), f"--junitxml={junit}"]
    with log.open("w") as out:
        try:
            subprocess.run(command, cwd=copy.parent, env=env, timeout=timeout, stdout=out, stderr=out, check=False)
        except subprocess.TimeoutExpired:
            results = _outcomes_so_far(log)
            results[f"{copy.stem}::*"] = {"outcome": "failed", "message": f"file timed out after {timeout:.0f} s"}
            return results
    return _outcomes(junit, copy.stem) or _outcomes_so_far(log)


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
