"""The rollout budget sizes the last cycle instead of skipping it."""

import pytest

from infra.orchestrator import CycleReport, EvolveConfig, cycle_size


def report(rollouts: int, opening: int, proposed: int) -> CycleReport:
    return CycleReport(cycle=1, cycle_id="r-c1", version_before=1, version_after=2,
                       proposed=tuple(f"scn-{i}" for i in range(proposed)), infeasible=0, decided={}, promoted=(),
                       retired=(), scores=(), rollouts=rollouts, seconds=1.0, opening=opening)


def config(budget: int | None) -> EvolveConfig:
    return EvolveConfig(run_id="r", max_candidates=4, rollout_budget=budget)


def test_without_a_budget_or_a_cycle_to_learn_from_a_cycle_is_full_size():
    assert cycle_size(config(None), [report(800, 500, 4)], spent=10**6, opening=10**6) == 4
    assert cycle_size(config(1500), [], spent=200, opening=200) == 4


def test_the_last_cycle_proposes_what_the_budget_has_room_for():
    # cycle 1 spent 825: 500 on its sweeps, 325 on four candidates (81.25 each)
    done = [report(825, 500, 4)]
    assert cycle_size(config(1500), done, spent=825, opening=300) == 4  # 375 left: four fit
    assert cycle_size(config(1500), done, spent=825, opening=450) == 2  # 225 left: two
    assert cycle_size(config(1500), done, spent=825, opening=600) == 0  # 75 left: not one


@pytest.mark.parametrize("spent", [1500, 1600])
def test_a_spent_budget_starts_nothing(spent):
    assert cycle_size(config(1500), [], spent=spent, opening=0) == 0


def test_a_cycle_that_proposed_nothing_says_nothing_about_a_candidates_cost():
    done = [report(300, 300, 0), report(700, 300, 4)]  # 100 a candidate, from the second only
    assert cycle_size(config(1500), done, spent=1000, opening=250) == 2


@pytest.mark.parametrize("budget", [0, -5, 1.5])
def test_a_budget_below_one_or_not_a_whole_number_is_named(budget):
    with pytest.raises(ValueError, match="EvolveConfig.rollout_budget must be None or an integer >= 1"):
        config(budget)
