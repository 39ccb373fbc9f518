"""docs/fully_shard.md's account of torch's FSDP2 test suite agrees with tools/fsdp2_suite.py, without torch's test
files (the repository ships none): every test the doc lists as failing on ours is in the runner's
``SUITE_EXPECTATIONS`` with the same category, the counts add up (runnable - passing on ours = the rows listed,
per category too), and the runner's rewrite of a GPU test file gives what runs on CPU/gloo."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "fully_shard.md"
SECTION = "## torch's FSDP2 test suite"


def _runner():
    spec = importlib.util.spec_from_file_location("fsdp2_suite", ROOT / "tools" / "fsdp2_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section() -> str:
    text = DOC.read_text()
    assert SECTION in text, f"{DOC} lacks the section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    return body.split("\n## ", 1)[0]


def _counts(section: str) -> dict[str, int]:
    """The row under the header ``| runnable here | ours passes | behaviour | internals | refused |``."""
    lines = section.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| runnable here |"))
    names = [cell.strip() for cell in lines[header].strip("|").split("|")]
    values = [int(cell.strip()) for cell in lines[header + 2].strip("|").split("|")]
    return dict(zip(names, values))


def _failing_rows(section: str) -> dict[str, str]:
    """``file::Class::test`` -> category, from the rows ``| `test id` | category | reason |``."""
    rows = re.findall(r"^\| `(test_fully_shard_[^`]+)` \| ([^|]+?) \| [^|]+\|$", section, flags=re.MULTILINE)
    return {test: category for test, category in rows}


def _not_runnable_rows(section: str) -> set[str]:
    """The tests of the two-column table after "Not runnable here"."""
    table = section.split("Not runnable here", 1)[1]
    return set(re.findall(r"^\| `(test_fully_shard_[^`]+)` \| [^|]+\|$", table, flags=re.MULTILINE))


def test_every_failing_test_in_the_doc_is_in_the_runners_table_with_its_category():
    rows = _failing_rows(_section())
    expectations = _runner().SUITE_EXPECTATIONS
    assert rows == {test: category for test, (category, _) in expectations.items()}


def test_every_test_the_doc_calls_not_runnable_is_in_the_runners_table():
    assert _not_runnable_rows(_section()) == set(_runner().NOT_RUNNABLE_HERE)


def test_the_docs_counts_add_up_to_its_table():
    section = _section()
    counts, rows = _counts(section), _failing_rows(section)
    assert counts["runnable here"] - counts["ours passes"] == len(rows), counts
    categories = [c for c in _runner().CATEGORIES if c != "not runnable here"]
    assert set(counts) == {"runnable here", "ours passes", *categories}, counts
    for category in categories:
        assert counts[category] == sum(1 for c in rows.values() if c == category), (category, counts)


def test_a_gpu_test_file_is_rewritten_to_run_on_cpu(tmp_path):
    runner = _runner()
    suite, scratch = tmp_path / "suite", tmp_path / "scratch"
    suite.mkdir()
    scratch.mkdir()
    (suite / "test_fully_shard_x.py").write_text(
        "device_type = torch.accelerator.current_accelerator().type\n"
        "n = torch.get_device_module(device_type).device_count()\n"
        "ws = 4 if torch.accelerator.is_available() else 0\n"
        "replicate(m, device_ids=[self.rank])\n"
        'x = torch.randn(2, device="cuda").cuda()\n'
        '@unittest.skipIf(DISTRIBUTED_BACKEND != "nccl", "Requires NCCL backend")\n'
        'self.run_process_no_exception(\n    """\\\nimport logging\n""")\n'
    )
    (copy,) = runner.prepare(suite, scratch, None)
    lines = copy.read_text().splitlines()
    assert lines[0] == "import _hp_suite_patch  # noqa"
    assert lines[1:10] == [
        'device_type = "cpu"',
        "n = 4",
        "ws = 4 if True else 0",
        "replicate(m, device_ids=None)",
        'x = torch.randn(2, device="cpu").cpu()',
        '@unittest.skipIf(False, "Requires NCCL backend")',
        "self.run_process_no_exception(",
        '    """import _hp_suite_patch  # noqa',
        "import logging",
    ]
    assert lines[-1] == "_hp.cap_world_sizes(globals())"
    assert (scratch / "_hp_suite_patch.py").read_text() == (ROOT / "tools" / "fsdp2_suite_patch.py").read_text()


def test_a_failure_is_reported_by_its_error_and_the_test_line_raising_it():
    text = (
        "RuntimeError: Process 0 exited with error code 10 and exception:\n"
        'E   File "/tmp/s/test_fully_shard_frozen.py", line 215, in _test_x\n'
        "E     self.assertTrue(count >= 5)\n"
        "E   AssertionError: False is not true\n"
    )
    assert _runner()._reason(text) == "AssertionError: False is not true (test_fully_shard_frozen.py:215)"


_POISONING_CLASS = """
import unittest

FAILED_BEFORE = []


class Continuous(unittest.TestCase):
    def test_a_fails(self):
        FAILED_BEFORE.append(True)
        self.fail("the first test fails")

    def test_b_passes_alone(self):
        if FAILED_BEFORE:
            raise unittest.SkipTest("Previous test failed, skipping test_b_passes_alone")
"""


def test_a_continuous_class_skipped_after_a_failure_is_rerun_alone(tmp_path):
    """torch's ``MultiProcContinuousTest`` skips every later test of a class once one fails; the runner reruns
    each such test alone, so it is reported by its own outcome."""
    runner = _runner()
    copy = tmp_path / "test_fully_shard_poison.py"
    copy.write_text(_POISONING_CLASS)
    results = runner.run_file(copy, "torch", timeout=120, test_timeout=60)
    assert results["test_fully_shard_poison::Continuous::test_a_fails"]["outcome"] == "failed"
    assert results["test_fully_shard_poison::Continuous::test_b_passes_alone"]["outcome"] == "passed"
