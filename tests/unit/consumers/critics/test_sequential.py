"""The robustness critic's sequential rule: every decision path, its invariants, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest

from consumers.critics.exceptions import ConfigError, CriticError, CriticInputError
from consumers.critics.sequential import (
    ACCEPT,
    CONTINUE,
    FAILED,
    PASSED,
    PENDING,
    REJECT,
    SequentialConfig,
    decide,
)

CFG = SequentialConfig()


def bits(text: str) -> list[bool]:
    return [c == "1" for c in text]


def arm(candidate: str, parent: str) -> list[tuple[bool, bool]]:
    assert len(candidate) == len(parent)
    return list(zip(bits(candidate), bits(parent), strict=True))


def statuses(decision) -> dict[str, str]:
    return {name: check.status for name, check in decision.checks.items()}


def random_arms(seed: int, oracle: float, candidate, parent, n: int = 20):
    rng = np.random.default_rng(seed)
    o = (rng.random(n) < oracle).tolist()
    c = rng.random((len(candidate), n)) < np.array(candidate)[:, None]
    p = rng.random((len(parent), n)) < np.array(parent)[:, None]
    return o, {f"m{i}": list(zip(c[i].tolist(), p[i].tolist(), strict=True)) for i in range(len(candidate))}


# -- continue --------------------------------------------------------------------------------------

def test_no_complete_look_asks_for_the_first_batch():
    d = decide(bits("1111"), {"a": arm("1111", "1111"), "b": arm("0000", "1111")})
    assert (d.action, d.look, d.seeds, d.next_seeds, d.unused_seeds) == (CONTINUE, 0, 0, 5, 4)
    assert d.reason == "no complete look yet" and d.checks == {}
    assert d.rollouts == 0


def test_nothing_is_accepted_at_the_first_look():
    """Look 1 spends no alpha: even a perfect record only continues."""
    d = decide(bits("11111"), {"a": arm("11111", "11111"), "b": arm("00000", "11111")})
    assert (d.action, d.look, d.next_seeds) == (CONTINUE, 1, 10)
    assert all(c.status == PENDING for c in d.checks.values()), statuses(d)


def test_an_oracle_that_passed_its_test_but_fell_below_90_percent_keeps_it_pending():
    """Solvable crossed at look 2 (10/10), then the oracle failed 2 of 5: 13/15 < 90%; 18/20 can still do."""
    o = bits("1111111111" + "10101")
    a, b, par = "1110111011" + "11011", "0100100100" + "01001", "1" * 15
    d = decide(o, {"a": arm(a, par), "b": arm(b, par)})
    assert (d.action, d.look, d.next_seeds) == (CONTINUE, 3, 20)
    solvable = d.checks["solvable"]
    assert (solvable.status, solvable.passed_look) == (PENDING, 2)
    assert "below 90%" in solvable.reason
    assert statuses(d) == {"solvable": PENDING, "reproducible": PASSED, "harder": PASSED, "discriminative": PENDING}
    # the passes of look 2 are kept, and the history shows each look
    assert [h["seeds"] for h in d.history] == [5, 10, 15]
    assert d.history[1]["checks"]["solvable"][0] == PASSED


# -- accept ----------------------------------------------------------------------------------------

def test_a_clear_candidate_is_accepted_at_the_second_look():
    d = decide(bits("1" * 10), {"strong": arm("1" * 10, "1" * 10), "weak": arm("0" * 10, "1" * 10)})
    assert (d.action, d.look, d.seeds, d.next_seeds) == (ACCEPT, 2, 10, None)
    assert all(c.status == PASSED and c.passed_look == 2 for c in d.checks.values()), statuses(d)
    assert d.checks["harder"].model == "weak" and d.checks["reproducible"].model == "weak"
    assert d.checks["discriminative"].model == "strong>weak"
    assert d.spread == 1.0
    # rollouts: both models on both arms, the oracle on the candidate only
    assert (d.candidate_rollouts, d.control_rollouts, d.rollouts) == (30, 20, 50)
    assert d.rollouts_per_model == pytest.approx(50 / 3)
    assert d.new_rollouts(existing_control_seeds=10) == 30
    assert d.new_rollouts(existing_control_seeds=4) == 30 + 2 * 6


def test_outcomes_past_the_deciding_look_are_unused():
    d = decide(bits("1" * 17), {"strong": arm("1" * 17, "1" * 17), "weak": arm("0" * 17, "1" * 17)})
    assert (d.action, d.look, d.unused_seeds) == (ACCEPT, 2, 7)


def test_accepted_verdict_fields_are_shaped_for_critic_verdict():
    d = decide(bits("1" * 10), {"strong": arm("1" * 10, "1" * 10), "weak": arm("0" * 10, "1" * 10)})
    v = d.verdict_fields(CFG)
    assert set(v) == {"critic", "critic_version", "ran", "score", "passed", "backend", "reason",
                      "evidence_json", "rollouts"}
    assert (v["critic"], v["ran"], v["passed"], v["score"], v["rollouts"]) == ("robustness", True, True, 1.0, 50)
    evidence = json.loads(v["evidence_json"])
    assert evidence["action"] == ACCEPT and evidence["config"]["alpha"] == CFG.alpha
    assert evidence["models"]["weak"] == {"candidate_successes": 0, "parent_successes": 10,
                                          "parent_only": 10, "candidate_only": 0}


# -- reject ----------------------------------------------------------------------------------------

def test_an_oracle_that_fails_is_rejected_as_unsolvable_at_the_first_look():
    d = decide(bits("10100"), {"a": arm("10000", "11111"), "b": arm("00000", "11111")})
    assert (d.action, d.look) == (REJECT, 1)
    assert d.checks["solvable"].status == FAILED
    assert d.reason.startswith("solvable: oracle 2/5")


def test_three_oracle_failures_can_never_reach_90_percent_of_20():
    """Curtailment (beta futility made negligible to isolate it): 7/10, then perfect, is 17/20 = 85%."""
    d = decide(bits("1101101101"), {"a": arm("1" * 10, "1" * 10), "b": arm("0" * 10, "1" * 10)},
               SequentialConfig(beta=0.001))
    assert (d.action, d.look) == (REJECT, 2)
    assert d.checks["solvable"].status == FAILED
    assert "can no longer reach" in d.checks["solvable"].reason


def test_a_candidate_no_different_from_its_parent_is_rejected_at_the_first_look():
    d = decide(bits("11111"), {"a": arm("11111", "11111"), "b": arm("11111", "11111"), "c": arm("11110", "11111")})
    assert (d.action, d.look) == (REJECT, 1)
    assert d.checks["harder"].status == FAILED and d.checks["reproducible"].status == FAILED
    assert "harder: no model loses enough against the parent" in d.reason


def test_models_all_failing_alike_are_not_discriminative():
    d = decide(bits("11111"), {"a": arm("00000", "11111"), "b": arm("00000", "11111")})
    assert (d.action, d.look) == (REJECT, 1)
    assert statuses(d)["discriminative"] == FAILED
    assert statuses(d)["harder"] == PENDING  # it is harder; that is not enough
    assert "rates lie within" in d.checks["discriminative"].reason


def test_models_at_one_middling_rate_stop_on_conditional_power():
    """Both at 5/10: the range test could not pass by 20 seeds at these rates."""
    d = decide(bits("1" * 10), {"a": arm("1010101010", "1" * 10), "b": arm("0101010101", "1" * 10)})
    assert d.action == REJECT and d.checks["discriminative"].status == FAILED
    assert "with probability" in d.checks["discriminative"].reason


def test_a_candidate_undecided_at_max_seeds_is_rejected_with_what_was_pending():
    o = bits("1" * 20)
    models = {"m0": arm("11011111110111111111", "11111111111101111111"),
              "m1": arm("00001110011101111101", "11111111111111111111"),
              "m2": arm("11011001110100011001", "11101011110111111111"),
              "m3": arm("10101110010001011010", "11111111111111111111")}
    d = decide(o, models)
    assert (d.action, d.look, d.seeds) == (REJECT, 4, 20)
    assert d.reason.startswith("undecided at max_seeds=20: discriminative:")
    assert statuses(d) == {"solvable": PASSED, "reproducible": PASSED, "harder": PASSED, "discriminative": PENDING}
    v = d.verdict_fields(CFG)
    assert v["passed"] is False and v["rollouts"] == 20 * 9


# -- invariants and determinism ------------------------------------------------------------------

CLASSES = [  # (oracle, candidate rates, parent rates)
    (0.98, (0.95, 0.75, 0.50, 0.25), (0.97, 0.95, 0.93, 0.92)),
    (0.85, (0.95, 0.75, 0.50, 0.25), (0.97, 0.95, 0.93, 0.92)),
    (0.98, (0.45, 0.45, 0.45, 0.45), (0.97, 0.95, 0.93, 0.92)),
    (0.98, (0.97, 0.95, 0.93, 0.92), (0.97, 0.95, 0.93, 0.92)),
]


@pytest.mark.parametrize("oracle,candidate,parent", CLASSES)
def test_invariants_over_random_candidates(oracle, candidate, parent):
    for seed in range(60):
        o, models = random_arms(seed, oracle, candidate, parent)
        d = decide(o, models)
        assert d.action in (ACCEPT, REJECT)  # 20 seeds always decide
        if d.action == ACCEPT:
            assert all(c.status == PASSED for c in d.checks.values())
            assert sum(o[:d.seeds]) >= 0.9 * d.seeds  # the oracle's 90%, by construction
            assert d.look >= 2
        # the same evidence cut at the deciding look decides the same; one look earlier continues
        cut = decide(o[:d.seeds], {m: p[:d.seeds] for m, p in models.items()})
        assert (cut.action, cut.look, cut.reason, cut.checks) == (d.action, d.look, d.reason, d.checks)
        if d.look > 1:
            early = decide(o[:d.seeds - 1], {m: p[:d.seeds - 1] for m, p in models.items()})
            assert (early.action, early.next_seeds) == (CONTINUE, d.seeds)


def test_same_evidence_same_decision_whatever_the_model_order():
    o, models = random_arms(3, 0.98, (0.95, 0.75, 0.50, 0.25), (0.97, 0.95, 0.93, 0.92))
    d1 = decide(o, models)
    d2 = decide(list(o), dict(reversed(list(models.items()))))
    assert (d1.action, d1.look, d1.reason, d1.checks) == (d2.action, d2.look, d2.reason, d2.checks)
    assert d1.verdict_fields(CFG) == d2.verdict_fields(CFG)  # byte-identical evidence


def test_false_promotion_stays_under_alpha_on_a_null_class():
    """A regression guard for the bench's figure: all models at one rate (discriminative null)."""
    promoted = sum(decide(*random_arms(seed, 0.98, (0.5,) * 4, (0.95,) * 4)).action == ACCEPT for seed in range(300))
    assert promoted / 300 <= CFG.alpha


def test_a_verdict_before_the_decision_is_refused():
    d = decide(bits("11111"), {"a": arm("11111", "11111"), "b": arm("00000", "11111")})
    with pytest.raises(CriticError, match="no robustness verdict yet: the rule asks for 10 seeds"):
        d.verdict_fields(CFG)


# -- bad input and config --------------------------------------------------------------------------

@pytest.mark.parametrize("oracle,models,match", [
    ([1, 1], {"a": [], "b": []}, "oracle outcome at seed index 0 must be a bool, got 1"),
    ("11", {"a": [], "b": []}, "oracle outcomes must be a sequence of bools"),
    ([True], {"a": [(True, True)]}, "at least two registered models"),
    ([True], {"a": [(True, None)], "b": []}, r"model a, seed index 0: expected \(candidate_success, parent_success\)"),
    ([True], {"a": [(True,)], "b": []}, "model a, seed index 0"),
    ([True], {"": [], "b": []}, "model ids must be non-empty strings"),
])
def test_bad_outcomes_are_refused_with_what_was_wrong(oracle, models, match):
    with pytest.raises(CriticInputError, match=match):
        decide(oracle, models)


@pytest.mark.parametrize("over,match", [
    ({"look_seeds": 0}, "look_seeds must be a positive int"),
    ({"max_seeds": 22}, "must be a multiple of look_seeds"),
    ({"alpha": 0.0}, "alpha must be in"),
    ({"alpha_spending": (0.5, 0.5)}, "alpha_spending must be 4 non-negative shares"),
    ({"beta_spending": (0.5, 0.5, 0.5, -0.5)}, "beta_spending must be 4"),
    ({"oracle_design_rate": 0.5}, "oracle_design_rate .* must exceed oracle_null_rate"),
    ({"reproducible_design_failure": 0.1}, "must exceed reproducible_null_failure"),
])
def test_bad_config_is_refused_quoting_the_value(over, match):
    with pytest.raises(ConfigError, match=match):
        SequentialConfig(**over)


def test_spending_adds_up_to_alpha_and_beta():
    alphas, betas = CFG.spending()
    assert len(alphas) == len(betas) == CFG.looks == 4
    assert sum(alphas) == pytest.approx(CFG.alpha) and sum(betas) == pytest.approx(CFG.beta)
    assert alphas[0] == 0.0


# -- harder: one model of many ------------------------------------------------------------------

def test_one_model_that_loses_every_seed_its_parent_won_is_harder_however_many_models_do_not_move():
    """LIBERO's moved camera: one pixel policy loses the 8 seeds its parent won; two others win and
    lose seeds at random; four pose readers never move. The seed-pooled sum cancels (seeds 0-7 net
    0 at 10 seeds); the weak model's own McNemar test, sharing the level only with tests that could
    reject, carries it."""
    solid = arm("1" * 20, "1" * 20)
    models = {f"scripted-{i}": solid for i in range(4)}
    models["pixel-weak"] = arm("0" * 20, "1" * 8 + "0" * 12)
    models["pixel-a"] = arm("1111" + "0" * 16, "0" * 10 + "111" + "0" * 7)
    models["pixel-b"] = arm("0000" + "1111" + "0" * 12, "0" * 13 + "111" + "0" * 4)
    d = decide(bits("1" * 20), models)
    assert (d.action, d.look) == (ACCEPT, 2), d.reason
    harder = d.checks["harder"]
    assert harder.status == PASSED and harder.model == "pixel-weak"
    assert harder.p_value == pytest.approx(2 ** -8)  # alone able to reject at look 2: no Bonferroni factor
    assert "McNemar" in harder.reason and "pixel-weak parent-only 8, candidate-only 0" in harder.reason


def test_a_model_whose_parent_never_succeeds_cannot_stop_a_candidate_for_futility():
    """The futility bound is on the share of the parent's successes a model loses: a model the
    parent never carried says nothing, and one that lost the one seed its parent won is still watched."""
    models = {"strong": arm("11111", "11111"), "never": arm("00000", "00000"), "weak": arm("00000", "10000")}
    d = decide(bits("11111"), models)
    assert d.action == CONTINUE and d.checks["harder"].status == PENDING, d.checks["harder"].reason
