"""The safety critic: unsafe contact per episode, and the oracle's share deciding the candidate."""

from __future__ import annotations

import json

import pytest

from consumers.critics.exceptions import ConfigError, CriticInputError
from consumers.critics.safety import SafetyConfig, episode_safety, judge_safety

CFG = SafetyConfig()


def quality(peak: float = 40.0, mean: float = 20.0) -> dict:
    return {"smoothness_jerk": 1.0, "path_efficiency": 0.8, "peak_contact_force": peak, "mean_contact_force": mean,
            "time_to_success": 60, "regrasp_count": 0, "idle_steps": 3}


def moment(kind: str, step: int = 30, severity: float = 0.5, **features) -> dict:
    return {"moment_id": f"m-{kind}-{step}", "failure_type": kind, "step": step, "severity": severity,
            "features": {k: float(v) for k, v in features.items()}, "recovered_step": -1, "recovery": ""}


def episode(eid: str, model: str = "oracle", peak: float = 40.0, mean: float = 20.0, moments=(),
            analysed: bool = True) -> dict:
    return {"episode_id": eid, "scenario_id": "scn-c", "model_id": model, "success": True, "termination": "success",
            "steps": 80, "quality": quality(peak, mean), "analysed": analysed, "reason": "",
            "moments": list(moments), "detector_version": "failure-detector/1.1"}


def safe_oracle(n: int) -> list[dict]:
    return [episode(f"o{i}") for i in range(n)]


@pytest.mark.parametrize("event,why", [
    (episode("e", peak=150.0), "peak contact 150 N >= 150 N"),
    (episode("e", mean=80.0), "mean contact 80 N >= 70 N"),
    (episode("e", moments=[moment("excessive_force", 12, 0.3, by_grip=1)]),
     "excessive_force at step 12 (severity 0.30, by grip)"),
    (episode("e", moments=[moment("collision", 40, force_n=55.0, by_arm=0)]), "collision at step 40, 55 N >= 50 N"),
    (episode("e", moments=[moment("collision", 41, force_n=30.0, by_arm=1)]), "arm collision at step 41, 30 N >= 25 N"),
])
def test_each_unsafe_criterion(event, why):
    assert episode_safety(event, CFG).unsafe == (why,)


@pytest.mark.parametrize("event", [
    episode("e", peak=149.0, mean=69.0),
    episode("e", moments=[moment("collision", force_n=20.0, by_arm=0)]),  # a hand brushing the table
    episode("e", moments=[moment("collision", force_n=24.0, by_arm=1)]),
    episode("e", moments=[moment("slip"), moment("grasp_miss"), moment("knocked_object")]),
])
def test_contact_below_the_thresholds_is_safe(event):
    assert episode_safety(event, CFG).unsafe == ()


def test_a_severity_floor_ignores_mild_excessive_force():
    event = episode("e", moments=[moment("excessive_force", severity=0.05, by_torque=1)])
    assert episode_safety(event, CFG).unsafe == ("excessive_force at step 30 (severity 0.05, by torque)",)
    assert episode_safety(event, SafetyConfig(min_excessive_force_severity=0.1)).unsafe == ()


def test_an_oracle_forced_into_unsafe_contact_rejects_the_candidate():
    events = safe_oracle(8) + [episode("o8", peak=300.0),
                               episode("o9", moments=[moment("collision", force_n=80.0, by_arm=0)])]
    v = judge_safety(events, "oracle")
    assert (v.ran, v.passed, v.score) == (True, False, 0.8)
    assert v.reason.startswith("oracle unsafe in 2/10 episodes (>= 2 and >= 20%): o8: peak contact 300 N")
    fields = v.fields()
    assert (fields["critic"], fields["backend"], fields["passed"], fields["rollouts"]) == ("safety", "rule", False, 0)
    evidence = json.loads(fields["evidence_json"])
    assert [e["episode_id"] for e in evidence["oracle_unsafe"]] == ["o8", "o9"]
    assert evidence["oracle_peak_contact_force_max"] == 300.0


def test_one_unsafe_oracle_episode_is_an_accident_and_a_small_share_passes():
    assert judge_safety(safe_oracle(9) + [episode("o9", peak=300.0)], "oracle").passed is True
    three_in_twenty = safe_oracle(17) + [episode(f"u{i}", peak=300.0) for i in range(3)]
    v = judge_safety(three_in_twenty, "oracle")
    assert (v.passed, v.score) == (True, 0.85)
    assert v.reason == "oracle unsafe in 3/20 episodes, below 2 episodes or 20%"


def test_clumsy_models_do_not_reject_a_candidate_the_oracle_handles_safely():
    events = safe_oracle(10) + [episode(f"c{i}", model="clumsy", peak=400.0) for i in range(10)]
    v = judge_safety(events, "oracle")
    assert v.passed is True
    assert json.loads(v.fields()["evidence_json"])["models_unsafe"] == {"clumsy": {"unsafe": 10, "episodes": 10}}


def test_no_oracle_episode_is_missing_evidence_not_a_pass():
    v = judge_safety([episode("c0", model="clumsy")], "oracle")
    assert (v.ran, v.passed, v.score) == (False, None, None)
    assert v.reason == "not run: no validation episode of the oracle 'oracle'"
    assert v.fields()["ran"] is False


def test_a_redelivered_episode_counts_once_and_order_does_not_matter():
    events = safe_oracle(4) + [episode("o9", peak=300.0), episode("o8", peak=300.0)]
    v1 = judge_safety(events + events[:5], "oracle")
    v2 = judge_safety(list(reversed(events)), "oracle")
    assert len(v1.oracle) == 6 and v1.fields() == v2.fields()


def test_an_unanalysed_episode_is_judged_on_its_quality_and_listed():
    v = judge_safety(safe_oracle(3) + [episode("o3", analysed=False)], "oracle")
    assert json.loads(v.fields()["evidence_json"])["oracle_unanalysed"] == ["o3"]


@pytest.mark.parametrize("event,match", [
    ({"model_id": "oracle"}, "needs an episode_id"),
    (episode("e") | {"model_id": ""}, "episode e: model_id must be a non-empty string"),
    (episode("e") | {"quality": None}, "episode e: quality must be an ExecutionQuality record"),
    (episode("e") | {"quality": quality() | {"peak_contact_force": "high"}}, "peak_contact_force must be a number"),
    (episode("e") | {"quality": quality() | {"mean_contact_force": -1.0}}, "mean_contact_force must be >= 0 N"),
    (episode("e") | {"moments": "none"}, "moments must be a list"),
    (episode("e", moments=[moment("collision")]), "force_n must be a number, got None"),
    (episode("e", moments=[moment("excessive_force") | {"severity": None}]), "severity must be a number"),
    (episode("e", moments=[42]), "a moment must be a MomentOutcome record"),
])
def test_malformed_events_are_refused_naming_the_episode(event, match):
    with pytest.raises(CriticInputError, match=match):
        judge_safety([event], "oracle")


def test_bad_config_is_refused():
    with pytest.raises(ConfigError, match="unsafe_peak_contact_force_n must be a positive force"):
        SafetyConfig(unsafe_peak_contact_force_n=0)
    with pytest.raises(ConfigError, match="max_oracle_unsafe_fraction must be in"):
        SafetyConfig(max_oracle_unsafe_fraction=0.0)
    with pytest.raises(ConfigError, match="min_unsafe_oracle_episodes"):
        SafetyConfig(min_unsafe_oracle_episodes=0)
