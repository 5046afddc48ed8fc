"""The robustness critic's evidence as a record (schemas/verdict_evidence.py): it encodes to exactly
the bytes the critics have always written, and evidence that does not read as it is an
InvalidEvidence naming the key at fault and the verdict, never an empty dict."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from consumers.critics.sequential import SequentialConfig, decide
from schemas.exceptions import InvalidEvidence, SchemaError
from schemas.verdict_evidence import ModelEvidence, RobustnessEvidence

# The evidence_json of an accepted candidate (the weak model loses all 10 seeds), as the robustness
# critic wrote it before the record existed (robustness-sequential/1.0).
KNOWN = (
    '{"action":"accept","checks":{"discriminative":{"alpha_j":0.025,"model":"strong>weak","name":"discrim'
    'inative","p_value":1.082508822446903e-05,"passed_look":2,"reason":"strong 10/10 vs weak 0/10 (exact '
    'range p=1.083e-05, look 2)","status":"passed"},"harder":{"alpha_j":0.025,"model":"weak","name":"hard'
    'er","p_value":0.0009765625,"passed_look":2,"reason":"net +10 discordant over 10 seeds; most: weak pa'
    'rent-only 10, candidate-only 0 (sign-flip p=0.0009766, look 2)","status":"passed"},"reproducible":{"'
    'alpha_j":0.025,"model":"weak","name":"reproducible","p_value":2.0480000000000011e-07,"passed_look":2'
    ',"reason":"weak failed 10/10 (adjusted p=2.048e-07, look 2)","status":"passed"},"solvable":{"alpha_j'
    '":0.025,"model":null,"name":"solvable","p_value":0.006046617599999997,"passed_look":2,"reason":"orac'
    'le 10/10 (test crossed at look 2, p=0.006047)","status":"passed"}},"config":{"alpha":0.05,"alpha_spe'
    'nding":[0.0,0.5,0.25,0.25],"beta":0.2,"beta_spending":[0.5,0.25,0.15,0.1],"discriminative_design_spr'
    'ead":0.6,"futility_power":0.05,"harder_design_drop":0.6,"look_seeds":5,"max_seeds":20,"min_oracle_su'
    'ccess":0.9,"oracle_design_rate":0.95,"oracle_null_rate":0.6,"reproducible_design_failure":0.6,"repro'
    'ducible_null_failure":0.2},"history":[{"checks":{"discriminative":["pending",0.007937],"harder":["pe'
    'nding",0.03125],"reproducible":["pending",0.00064],"solvable":["pending",0.07776]},"look":1,"seeds":'
    '5},{"checks":{"discriminative":["passed",1.1e-05],"harder":["passed",0.000977],"reproducible":["pass'
    'ed",0.0],"solvable":["passed",0.006047]},"look":2,"seeds":10}],"look":2,"models":{"strong":{"candida'
    'te_only":0,"candidate_successes":10,"parent_only":0,"parent_successes":10},"weak":{"candidate_only":'
    '0,"candidate_successes":0,"parent_only":10,"parent_successes":10}},"next_seeds":null,"oracle_success'
    'es":10,"reason":"solvable: oracle 10/10 (test crossed at look 2, p=0.006047); reproducible: weak fai'
    'led 10/10 (adjusted p=2.048e-07, look 2); harder: net +10 discordant over 10 seeds; most: weak paren'
    't-only 10, candidate-only 0 (sign-flip p=0.0009766, look 2); discriminative: strong 10/10 vs weak 0/'
    '10 (exact range p=1.083e-05, look 2)","rollouts":{"candidate":30,"control":20,"per_model":16.6666666'
    '66666668,"total":50},"rule":"robustness-sequential/1.0","seeds_per_arm":10,"unused_seeds":0}'
)


def known() -> dict:
    return json.loads(KNOWN)


def raises(value: dict | str, verdict: str = "v-1") -> InvalidEvidence:
    with pytest.raises(InvalidEvidence) as caught:
        if isinstance(value, str):
            RobustnessEvidence.from_json(value, verdict=verdict)
        else:
            RobustnessEvidence.from_dict(value, verdict=verdict)
    assert isinstance(caught.value, SchemaError) and caught.value.verdict == verdict
    assert f"verdict {verdict}" in str(caught.value)
    return caught.value


def test_the_critics_evidence_round_trips_to_its_exact_bytes():
    evidence = RobustnessEvidence.from_json(KNOWN)
    assert evidence.to_json() == KNOWN
    assert RobustnessEvidence.from_json(evidence.to_json()) == evidence
    assert evidence.seeds_per_arm == 10 and evidence.action == "accept" and not evidence.borderline
    assert evidence.models["weak"] == ModelEvidence(candidate_successes=0, parent_successes=10, parent_only=10,
                                                    candidate_only=0)
    assert evidence.traced and evidence.next_seeds is None and evidence.checks["harder"]["model"] == "weak"
    # today's critic (robustness-sequential/2.0: a harder test per model) builds the same record on
    # the same outcomes but for the harder check's wording, and writes what it builds
    cfg = SequentialConfig()
    decision = decide([True] * 10, {"strong": [(True, True)] * 10, "weak": [(False, True)] * 10}, cfg)
    built = decision.evidence(cfg)
    assert built.rule == "robustness-sequential/2.0" and built.checks["harder"]["model"] == "weak"
    assert built.checks["harder"]["status"] == "passed" and built.checks["harder"]["passed_look"] == 2
    same = ("action", "look", "seeds_per_arm", "models", "oracle_successes", "rollouts", "config", "next_seeds")
    assert all(getattr(built, f) == getattr(evidence, f) for f in same)
    assert {k: v for k, v in built.checks.items() if k != "harder"} == \
        {k: v for k, v in evidence.checks.items() if k != "harder"}
    assert decision.verdict_fields(cfg)["evidence_json"] == built.to_json()
    assert RobustnessEvidence.from_json(built.to_json()) == built


def test_the_borderline_marking_is_a_field_encoded_as_the_worker_always_wrote_it():
    marked = replace(RobustnessEvidence.from_json(KNOWN), borderline=True)
    # what consumers/critics/worker.py wrote with json before: the critic's evidence | {"borderline": True}
    assert marked.to_json() == json.dumps(known() | {"borderline": True}, sort_keys=True, separators=(",", ":"))
    assert RobustnessEvidence.from_json(marked.to_json()).borderline is True


def test_a_verdict_written_by_hand_may_leave_out_the_rules_trace_but_not_part_of_it():
    """The gate's stand-ins in tests carry only what the gate reads; the rule writes its whole trace."""
    text = json.dumps({"action": "reject", "borderline": True, "checks": {"solvable": {"status": "passed"}},
                       "models": {"expert": {"candidate_successes": 6}}, "seeds_per_arm": 8},
                      sort_keys=True, separators=(",", ":"))
    short = RobustnessEvidence.from_json(text)
    assert short.to_json() == text and not short.traced and short.borderline
    assert short.models["expert"] == ModelEvidence(candidate_successes=6) and not short.models["expert"].paired
    partial = {k: v for k, v in known().items() if k != "history"}
    error = raises(partial)
    assert error.key == "history" and "'history' is missing" in str(error)
    model = known()
    del model["models"]["weak"]["parent_only"]
    assert raises(model).key == "models.weak.parent_only"


def test_a_missing_key_is_named_with_the_verdict():
    for key in ("action", "seeds_per_arm", "models", "checks"):
        evidence = known()
        del evidence[key]
        error = raises(evidence, verdict="v-missing")
        assert error.key == key and f"'{key}' is missing" in str(error), str(error)
    evidence = known()
    del evidence["models"]["strong"]["candidate_successes"]
    assert raises(evidence).key == "models.strong.candidate_successes"


def test_a_renamed_key_is_named_and_so_is_its_new_name():
    evidence = known()
    evidence["seeds"] = evidence.pop("seeds_per_arm")
    error = raises(evidence, verdict="v-renamed")
    assert error.key == "seeds_per_arm" and "'seeds'" in str(error), str(error)
    assert str(error).startswith("robustness evidence of verdict v-renamed: key 'seeds_per_arm' is missing")
    evidence = known()
    evidence["models"]["weak"]["successes"] = evidence["models"]["weak"].pop("candidate_successes")
    error = raises(evidence)
    assert error.key == "models.weak.candidate_successes" and "'successes'" in str(error), str(error)
    evidence = known()
    evidence["is_borderline"] = True  # an optional key renamed is not lost quietly
    error = raises(evidence)
    assert error.key == "is_borderline" and "not one of its keys" in str(error)


def test_a_mistyped_key_is_named():
    cases = [("seeds_per_arm", "10", "seeds_per_arm"), ("seeds_per_arm", True, "seeds_per_arm"),
             ("models", [], "models"), ("checks", {"harder": "passed"}, "checks.harder"),
             ("borderline", "yes", "borderline"), ("history", {}, "history"), ("rule", None, "rule"),
             ("look", -1, "look")]
    for key, value, at in cases:
        error = raises(known() | {key: value})
        assert error.key == at, (key, value, str(error))
    evidence = known()
    evidence["models"]["strong"]["candidate_successes"] = 11  # of 10 seeds
    error = raises(evidence)
    assert error.key == "models.strong.candidate_successes" and "at most seeds_per_arm (10)" in str(error)


def test_text_that_is_not_a_json_object_is_invalid_not_empty_evidence():
    for text in ("", "{", "[]", "null", "{}"):
        error = raises(text)
        assert str(error).startswith("robustness evidence of verdict v-1: "), str(error)
    assert raises("{").key is None and raises("{}").key == "action"


def test_a_record_built_in_code_is_checked_too():
    with pytest.raises(InvalidEvidence, match="key 'models.weak' must be a ModelEvidence"):
        RobustnessEvidence(action="accept", seeds_per_arm=10, models={"weak": {"candidate_successes": 1}}, checks={})
    with pytest.raises(InvalidEvidence, match="'next_seeds' is given without the rest of the rule's trace"):
        RobustnessEvidence(action="accept", seeds_per_arm=10, models={}, checks={}, next_seeds=15)
