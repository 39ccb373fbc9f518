"""The idealized pipeline (hyper_parallel.viz.pipeline_concept) against the bubble formula.

The schedule is simulated action by action from its order and its dependencies; the formula
(p-1)/(m+p-1) of the cost model is derived on paper. The two must agree on every stage.
"""

from __future__ import annotations

import pytest

from hyper_parallel.cost_model.pipeline import bubble_fraction
from hyper_parallel.viz.pipeline_concept import ideal_pipeline, idle_fraction, pipeline_concept, stage_order


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp, m", [(2, 1), (2, 4), (3, 5), (4, 8), (4, 2)])
def test_every_stage_idles_the_bubble_formula(schedule, pp, m):
    idle = idle_fraction(ideal_pipeline(schedule, pp, m))
    assert set(idle) == set(range(pp))
    for share in idle.values():
        assert share == pytest.approx(bubble_fraction(schedule, pp, m))


def test_1f1b_orders_warm_up_pp_minus_1_minus_s_forwards():
    """p=2, m=4: stage 0 F0 F1 B0 F2 B1 F3 B2 B3 (one warm-up forward), the last stage none."""
    short = [f"{action[0].upper()}{i}" for action, i in stage_order("1f1b", 2, 4, 0)]
    assert short == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert [a for a, _ in stage_order("1f1b", 2, 4, 1)][:2] == ["forward", "backward"]
    with pytest.raises(ValueError):
        stage_order("zero_bubble", 2, 4, 0)


def test_the_concept_figure_draws_every_action():
    fig = pipeline_concept("1f1b", 2, 4)
    [ax] = [a for a in fig.axes if a.get_label() == "concept:pipeline"]
    bars = [p.get_gid() for p in ax.patches if (p.get_gid() or "").startswith("pp:")]
    assert bars.count("pp:forward") == bars.count("pp:backward") == 2 * 4
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stage 0", "stage 1"]
