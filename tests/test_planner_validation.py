"""docs/planner_validation.md is regenerated here from the published runs (cost_model.calibration): the
committed file must equal what the model now predicts, the stored calibration constants must equal a
re-fit on the calibration rows, and the calibration rows must meet the goal they were fitted to.

`make docs` regenerates the document."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyper_parallel.cost_model.calibration import fit_gemm_efficiency, published_runs
from hyper_parallel.cost_model.hardware import get_hardware
from hyper_parallel.cost_model.validation_doc import render, rows

DOC = Path(__file__).resolve().parents[1] / "docs" / "planner_validation.md"


def test_validation_document_is_current():
    assert DOC.exists() and DOC.read_text(encoding="utf-8") == render(), (
        f"{DOC} is not the model's output: run make docs"
    )


@pytest.mark.parametrize("hardware", ["h100-nvl8-ndr", "a100-8"])
def test_stored_gemm_efficiency_is_the_fit_on_the_calibration_rows(hardware):
    """Calibrated once: the constant in hardware.py is what fit_gemm_efficiency finds (to 0.5 %)."""
    assert get_hardware(hardware).gemm_efficiency == pytest.approx(fit_gemm_efficiency(hardware), rel=5e-3)


def test_calibration_rows_meet_the_goal_and_misses_are_listed():
    """Every calibration row is within its goal; every row outside it is named in the document's section
    on where the goal is not met."""
    table = rows()
    assert {r["run"].name for r in table} == {run.name for run in published_runs()}
    assert all(r["within"] for r in table if r["run"].calibrate)
    misses = render().split("## Where the goal is not met")[1].split("##")[0]
    for row in table:
        assert (row["run"].name in misses) == (not row["within"])


def test_memory_rows_equal_zero_by_hand():
    """ZeRO's model states, 16 B per parameter (fp16 parameter and gradient, fp32 master, m and v): the 7.47e9
    parameters of the GPT shape used for ZeRO's 7.5B model take 16 x 7.47e9 = 119.5 GB without sharding and
    1/64 of it with stage 3; ZeRO's 120 GB and 1.9 GB round Psi = 7.5e9."""
    zero = {r["run"].name: r for r in rows() if r["run"].source == "zero"}
    ddp, stage3 = zero["ZeRO 7.5B, 64 GPUs, no sharding (DDP)"], zero["ZeRO 7.5B, 64 GPUs, stage 3 (FSDP 64)"]
    params = 36 * (12 * 4096**2 + 13 * 4096) + 51200 * 4096 + 2048 * 4096 + 2 * 4096
    assert ddp["predicted"] == pytest.approx(16 * params / 1e9, rel=1e-12)
    assert stage3["predicted"] == pytest.approx(16 * params / 64 / 1e9, rel=1e-3)  # padding to 64 shards
