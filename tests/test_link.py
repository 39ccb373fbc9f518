"""The emulated link without workers: its time model by hand, its text forms, its first-in-first-out clock,
that its wait burns no CPU, that a run record carries it to the worker, and the α-β step model's
arithmetic for M4 derived by hand from the recipe's shapes (docs/cli.md, "Emulated link")."""

from __future__ import annotations

import json
import time

import pytest

from hyper_parallel import link
from hyper_parallel.cost_model.emulated import emulated_step, link_seconds
from hyper_parallel.link import LINK_PRESETS, Link, LinkClock, parse_link
from hyper_parallel.mesh import ParallelDims
from hyper_parallel.recipes import worker
from hyper_parallel.recipes.run_spec import RunSpec
from launch.runs import resolve_run


def test_seconds_are_alpha_plus_wire_bytes_times_beta():
    fast = Link(2e-3, 1e6)
    # all-gather of 16 896 B on 2 ranks: each rank sends half of it
    assert fast.seconds("all_gather", 2, 16896) == pytest.approx(2e-3 + 8448 / 1e6)
    # all-reduce on 4 ranks: 2 (n-1)/n of the buffer
    assert fast.seconds("all_reduce", 4, 4000) == pytest.approx(2e-3 + 6000 / 1e6)
    assert fast.seconds("send", 2, 1000) == pytest.approx(2e-3 + 1000 / 1e6)
    assert fast.seconds("all_gather", 1, 16896) == 0.0  # one rank sends nothing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2ms,1MB/s", Link(2e-3, 1e6)),
        (" 0.5 s , 3 kB/s ", Link(0.5, 3e3)),
        ("100us,2.5GB/s", Link(1e-4, 2.5e9)),
        ("notebook", LINK_PRESETS["notebook"]),
        ("none", None),
        (None, None),
    ],
)
def test_text_forms(text, expected):
    assert parse_link(text) == expected


@pytest.mark.parametrize("bad", ["2ms", "fast", "2 parsecs,1MB/s", "-1ms,1MB/s", 3, "2ms,0MB/s"])
def test_a_bad_link_names_the_accepted_forms(bad):
    with pytest.raises(ValueError, match="link|bytes_per_s"):
        parse_link(bad)


def test_a_link_round_trips_through_its_text_and_json():
    odd = Link(1.234567e-3, 987654.321)
    assert parse_link(odd.text()) == odd and Link.from_json(json.loads(json.dumps(odd.to_json()))) == odd
    assert odd.describe().startswith("emulated link: α 1.23457 ms")


def test_one_group_is_one_link_first_in_first_out():
    """A collective issued while an earlier one on its group is on the wire starts when that one ends;
    another group's link is free."""
    clock = LinkClock(Link(0.05, 1e6))
    before = time.monotonic()
    first = clock.reserve("all_gather", "fsdp", 2, 20000)  # 0.05 + 0.01
    second = clock.reserve("reduce_scatter", "fsdp", 2, 20000)
    other = clock.reserve("all_reduce", "dp_replicate", 2, 0)
    assert first - before == pytest.approx(0.06, abs=0.005)
    assert second - first == pytest.approx(0.06, abs=1e-9)
    assert other - before == pytest.approx(0.05, abs=0.005)


def test_the_wait_sleeps_instead_of_burning_cpu():
    with link.emulating(Link(0.2, 1e6)) as clock:
        assert clock is not None
        end = link.reserve("broadcast", "fsdp", 2, 0)
        cpu, wall = time.process_time(), time.monotonic()
        assert not link.is_done(end)
        link.hold_until(end)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    assert link.is_done(end) and wall >= 0.19
    assert cpu < 0.05, f"{cpu:.3f} s of CPU in a {wall:.3f} s wait"
    assert link.reserve("broadcast", "fsdp", 2, 0) is None  # outside the block: no link


def test_a_run_record_carries_the_link_to_the_worker():
    spec = resolve_run("M4", world_size=2, dp_shard=2, link="3ms,2MB/s")
    assert spec.link == Link(3e-3, 2e6)
    assert RunSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    args = spec.worker_args()
    (again,) = worker.specs_of(worker.parse_args(args[2:]), world_size=2)
    assert again.link == spec.link
    assert resolve_run("M4", world_size=2, dp_shard=2).link is None
    with pytest.raises(ValueError, match="preset"):
        resolve_run("M4", world_size=2, dp_shard=2, link="warp-speed")


def test_link_time_of_m4_by_hand():
    """M4 on 2 ranks: units blocks.0, blocks.1 (4224 float32 each: 16 896 B) and the root (808: 3232 B).
    Forward: 3 all-gathers (the root's, then each block's); backward: the blocks' all-gathers again (the
    root keeps its parameters) and 3 reduce-scatters; each rank sends half of every buffer."""
    fast = Link(2e-3, 1e6)
    seconds = link_seconds("M4", {"global_batch": 16}, ParallelDims(world_size=2, dp_shard=2), fast)
    forward = 3 * 2e-3 + (3232 + 2 * 16896) / 2 / 1e6
    backward = 5 * 2e-3 + (2 * 16896 + 3232 + 2 * 16896) / 2 / 1e6
    assert seconds == pytest.approx({"forward": forward, "backward": backward, "critical": 0.0})
    compute, other = {"forward": 0.01, "backward": 0.03}, 0.005
    dims = ParallelDims(world_size=2, dp_shard=2)
    off = emulated_step("M4", {"global_batch": 16}, dims, fast, overlap=False, compute=compute, other=other)
    assert off.exposed == pytest.approx(forward + backward) and off.total == pytest.approx(0.045 + forward + backward)
    on = emulated_step("M4", {"global_batch": 16}, dims, fast, overlap=True, compute=compute, other=other)
    # forward all-gathers are not prefetched; backward: the planner's pipeline of n = 3 units
    assert on.exposed == pytest.approx(forward + backward / 3 + 2 / 3 * (backward - 0.03))
    assert on.hidden == pytest.approx(off.exposed - on.exposed) and on.total < off.total


def test_the_docs_and_notebook_01_say_the_presets_and_the_lesson_as_they_are():
    """docs/cli.md's table of presets and notebook 01's parameters and text name the values the code has."""
    import re
    from pathlib import Path

    from launch.notebook.link_lesson import GLOBAL_BATCH, LINK

    root = Path(__file__).resolve().parent.parent
    rows = re.findall(r'^\| `"(\w+)"` \| ([\d.]+) ms \| ([\d.]+) MB/s \|', (root / "docs" / "cli.md").read_text(), re.M)
    assert {name: Link(float(ms) / 1e3, float(mbs) * 1e6) for name, ms, mbs in rows} == LINK_PRESETS
    notebook = json.loads((root / "notebooks" / "01_ddp_fsdp.ipynb").read_text())
    parameters = "".join(notebook["cells"][1]["source"])
    assert f'link = "{LINK}"' in parameters and f"link_batch = {GLOBAL_BATCH}" in parameters
    text = "".join("".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown")
    assert LINK_PRESETS[LINK] == Link(2e-3, 1e6) and "α = 2 ms and 1 MB/s" in text and "4096 rows" in text


def test_waiting_counts_synchronous_collectives_whole_and_asynchronous_ones_from_their_wait():
    from hyper_parallel.viz.overlap import compute_by_phase, step_waiting

    def collective(start, end, **extra):
        return {"kind": "collective", "step": 1, "phase": "backward", "t_start": start, "t_end": end, **extra}

    events = [
        collective(0.0, 1.0),  # synchronous: waited whole
        collective(2.0, 5.0, asynchronous=True, t_wait=4.0),  # in flight 2-4 behind compute, waited 4-5
        collective(4.5, 6.0, asynchronous=True, t_wait=4.5),  # waited 4.5-6, overlapping the one before
        {**collective(0.0, 9.0), "phase": "init"},  # set-up, not the step's
        {"kind": "compute", "step": 1, "phase": "backward", "t_start": 1.0, "t_end": 4.0},
        {"kind": "compute", "step": 1, "phase": "forward", "t_start": 7.0, "t_end": 7.5},
    ]
    assert step_waiting(events, 1) == pytest.approx(1.0 + 2.0)
    assert compute_by_phase(events, 1) == pytest.approx({"backward": 3.0, "forward": 0.5})
