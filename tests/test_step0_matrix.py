"""tools/step0_matrix.py's summary of two trees' runs: step 0 and the later step per recipe, the excess summed
over the matrix, and bit equality of the numbers, checked on hand-made replies (no worker starts)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("step0_matrix", ROOT / "tools" / "step0_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reply(tree: str, recipe: str, step_times: list[float], losses=(1.5, 1.25), diff=0.0) -> dict:
    return {
        "tree": tree,
        "recipe": recipe,
        "ok": True,
        "step_times": step_times,
        "losses": [float(x).hex() for x in losses],
        "max_abs_diff": float(diff).hex(),
        "max_param_diff": float(0).hex(),
    }


def test_rows_take_medians_over_rounds_and_sum_the_excess():
    tool = _tool()
    runs = [
        _reply("before", "S2", [1.0, 0.25, 0.35]),  # later: median(0.25, 0.35) = 0.30
        _reply("after", "S2", [0.5, 0.2, 0.2]),
        _reply("before", "S2", [3.0, 0.30, 0.30]),  # rounds' medians: step 0 (1.0 + 3.0) / 2, later 0.30
        _reply("after", "S2", [0.4, 0.2, 0.2]),
        _reply("before", "M4", [0.4, 0.1, 0.1]),
        _reply("after", "M4", [0.3, 0.1, 0.1]),
    ]
    rows = {row["recipe"]: row for row in tool.summarise(runs)}
    assert rows["S2"]["before"]["step0"] == pytest.approx(2.0)
    assert rows["S2"]["before"]["later"] == pytest.approx(0.30)
    assert rows["S2"]["before"]["ratio"] == pytest.approx(2.0 / 0.30)
    assert rows["S2"]["after"]["step0"] == pytest.approx(0.45)
    assert rows["S2"]["after"]["excess"] == pytest.approx(0.25)
    assert all(row["bit_equal"] for row in rows.values())
    # before: (2.0 - 0.3) + (0.4 - 0.1); after: (0.45 - 0.2) + (0.3 - 0.1)
    assert tool.excess_sum(list(rows.values()), "before") == pytest.approx(2.0)
    assert tool.excess_sum(list(rows.values()), "after") == pytest.approx(0.45)
    printed = tool.table(list(rows.values()))
    assert "| S2 | 2.000 / 0.450 | 0.300 / 0.200 | 6.67 -> 2.25 **> 2** | bit-equal |" in printed
    assert "2.00 s before, 0.45 s after" in printed


def test_one_differing_bit_or_a_missing_tree_is_not_bit_equal():
    tool = _tool()
    loss = 1.25
    runs = [
        _reply("before", "S2", [1.0, 0.2], losses=(1.5, loss)),
        _reply("after", "S2", [1.0, 0.2], losses=(1.5, math.nextafter(loss, 2.0))),  # one bit up
        _reply("before", "M4", [1.0, 0.2]),
        _reply("before", "M7", [1.0, 0.2], diff=0.0),
        _reply("after", "M7", [1.0, 0.2], diff=5e-7),
    ]
    rows = {row["recipe"]: row for row in tool.summarise(runs)}
    assert not rows["S2"]["bit_equal"]
    assert not rows["M4"]["bit_equal"] and rows["M4"]["after"] is None
    assert not rows["M7"]["bit_equal"]
    assert tool.excess_sum(list(rows.values()), "before") == pytest.approx(1.6)  # M4 ran in one tree only
