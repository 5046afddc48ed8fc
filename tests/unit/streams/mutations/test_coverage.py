"""The coverage grid: every point a valid one-factor variant of the base, walked in a fixed order,
nothing proposed twice, and what does not apply skipped with the reason."""

import pytest

from schemas.scenario import ScenarioSpec
from streams.mutations.coverage import GRID, LAST, coverage_candidates, fixed_variant, grid_order
from streams.mutations.exceptions import OperatorError

LIFT = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube")


def test_every_grid_point_changes_one_field_of_the_base():
    base = LIFT.to_dict()
    for factor, magnitude in grid_order():
        child = fixed_variant(LIFT, factor, magnitude).to_dict()
        changed = {k for k in base if child[k] != base[k]} - {"scenario_id", "parent_id"}
        # a start region is its x and y range together; a hold extends the horizon by itself
        assert len(changed - {"placement_y_range"} - ({"horizon"} if factor == "hold" else set())) == 1, \
            (factor, magnitude, changed)


def test_the_grid_walks_each_level_across_factors_and_the_unfelt_factors_last():
    order = grid_order()
    assert len(order) == sum(len(v) for v in GRID.values())
    first = [f for f in GRID if f not in LAST]
    assert order[:len(first)] == [(f, GRID[f][0]) for f in first]
    assert {f for f, _ in order[-2 * len(LAST):]} <= set(LAST)


def test_a_distractor_sits_in_the_approach_and_a_time_budget_cuts_the_horizon():
    d = fixed_variant(LIFT, "distractors", 0.075).distractors[-1]
    assert d.x == pytest.approx(-0.075) and d.y == pytest.approx(0.0)  # between the gripper's start and the cube
    assert fixed_variant(LIFT, "time_budget", 0.45).horizon == 90


def test_candidates_skip_what_was_proposed_and_what_does_not_apply():
    first = coverage_candidates([LIFT], 4).candidates
    nxt = coverage_candidates([LIFT], 4, exclude={c.scenario_id for c in first}).candidates
    assert [c.factor for c in first + nxt] == [f for f, _ in grid_order()[:8]]
    assert {c.generator for c in first} == {"coverage"} and all(c.params["chosen_by"] == "coverage" for c in first)
    stack = ScenarioSpec(env_name="Stack", horizon=300, instruction="stack the red cube on the green cube")
    swept = coverage_candidates([stack], 100)
    assert "place" not in {c.factor for c in swept.candidates}
    assert any("place applies to a Lift scenario" in s.reason for s in swept.skipped)
    with pytest.raises(OperatorError, match="unknown factor 'gravity'"):
        fixed_variant(LIFT, "gravity", 1.0)


def test_a_factor_filter_walks_only_those_factors_in_grid_order():
    only = coverage_candidates([LIFT], 3, factors={"mass", "hold"}).candidates
    assert [(c.factor, float(c.params["magnitude"])) for c in only] == \
        [(f, float(m)) for f, m in grid_order() if f in {"mass", "hold"}][:3]
