"""Trace recorder and trace files, in one process (no process group needed)."""

from __future__ import annotations

import json

import pytest
import torch

from hyper_parallel import trace
from hyper_parallel.run_files import load_traces, to_chrome_trace, trace_path


def test_recorder_labels_and_saves(tmp_path):
    with trace.record() as recorder:
        trace.set_step(3)
        with (
            trace.labels(phase="backward", module="blocks.0"),
            trace.collective("reduce_scatter", "fsdp", [0, 1], 64, torch.float32),
        ):
            pass
        trace.placement("w", ("fsdp",), "(S(0))", "(R)", (2, 4), (4, 4))
    assert trace.current() is None
    collective, placement = recorder.events
    assert collective["op"] == "reduce_scatter" and collective["phase"] == "backward"
    assert collective["module"] == "blocks.0" and collective["step"] == 3 and collective["dtype"] == "float32"
    assert collective["t_end"] >= collective["t_start"] >= 0
    assert placement["phase"] == "init" and placement["before"] == "(S(0))"
    recorder.save(trace_path(tmp_path, 0))
    assert load_traces(tmp_path) == {0: recorder.events}


def test_nothing_is_recorded_outside_a_recorder():
    with trace.collective("all_reduce", "dp", [0, 1], 8, torch.float32):
        pass
    trace.placement("w", ("fsdp",), "a", "b", (1,), (2,))
    with trace.record() as recorder:
        pass
    assert recorder.events == []


def test_unknown_phase_is_rejected():
    with trace.record(), pytest.raises(ValueError, match="unknown phase"):
        trace.set_phase("warmup")


def test_chrome_trace_has_one_process_per_rank(tmp_path):
    event = {
        "kind": "collective",
        "op": "all_gather",
        "group": "fsdp",
        "ranks": [0, 1],
        "bytes": 16,
        "dtype": "float32",
        "phase": "forward",
        "module": "root",
        "step": 0,
        "t_start": 0.5,
        "t_end": 0.75,
    }
    path = to_chrome_trace({0: [event], 1: [dict(event, t_start=0.6)]}, tmp_path / "chrome.json")
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert [(e["pid"], e["ts"], round(e["dur"], 6)) for e in slices] == [(0, 0.5e6, 0.25e6), (1, 0.6e6, 0.15e6)]
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {"rank 0", "rank 1"}


def test_chrome_trace_draws_a_ring_step_as_a_slice_of_its_own(tmp_path):
    step = {"kind": "ring", "phase": "forward", "ring_step": 1, "block": 3, "pairs": 2, "step": 0}
    path = to_chrome_trace({0: [dict(step, t_start=0.25, t_end=0.5)]}, tmp_path / "chrome.json")
    (ring,) = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert (ring["tid"], ring["name"], ring["ts"], ring["dur"]) == (
        "ring",
        "ring step 1: block 3 (2 pairs)",
        0.25e6,
        0.25e6,
    )
