"""A candidate the sequential rule rejects only for running out of seeds, every test still under
the nominal alpha, is borderline (a person decides); one a test clearly failed is not."""

from consumers.critics.sequential import FAILED, PASSED, REJECT, CheckResult, Decision, SequentialConfig
from consumers.critics.worker import borderline

CFG = SequentialConfig()


def decision(seeds: int, *p_values: float) -> Decision:
    checks = {f"c{i}": CheckResult(f"c{i}", PASSED if p < 0.001 else FAILED, p, 0.01, 1 if p < 0.001 else 0, None, "")
              for i, p in enumerate(p_values)}
    return Decision(REJECT, 4, seeds, None, checks, 10, {}, "ran out of seeds")


def test_undecided_at_the_last_look_with_every_test_near_its_level_is_borderline():
    assert borderline(decision(CFG.max_seeds, 0.0001, 0.03), CFG)


def test_a_test_far_from_its_level_or_an_early_stop_is_a_rejection():
    assert not borderline(decision(CFG.max_seeds, 0.0001, 0.4), CFG)
    assert not borderline(decision(CFG.look_seeds, 0.0001, 0.03), CFG)  # futility before the last look
