"""bench/failure_mining.py's scoring: strict classes by the first unrecovered moment, lenient
detections anywhere, the tuning / held-out split."""

from bench.failure_mining import NONE, score_lenient, score_strict, split, strict_class
from producers.sim.failure_set import LabelledEpisode


def label(case: str, seed: int, expected: str | None, success: bool, cause: int | None = 10,
          after: tuple[str, ...] = ("stall", "timeout")) -> LabelledEpisode:
    return LabelledEpisode(case=case, seed=seed, episode_id=f"{case}-{seed}", scenario_id="scn", expected=expected,
                           after=list(after), cause_step=cause, success=success, termination="timeout", steps=100)


def moment(failure_type: str, step: int, recovered: int = -1) -> dict:
    return {"moment_id": f"{failure_type}-{step}", "failure_type": failure_type, "step": step, "severity": 1.0,
            "features": {}, "recovered_step": recovered, "recovery": "regrasped" if recovered >= 0 else ""}


def analysed(*moments: dict) -> dict:
    return {"moments": list(moments)}


def test_the_strict_class_is_the_first_unrecovered_moment():
    assert strict_class(analysed()) == (NONE, None, False)
    assert strict_class(analysed(moment("grasp_miss", 10, recovered=20))) == (NONE, None, False)
    assert strict_class(analysed(moment("grasp_miss", 10, recovered=20), moment("stall", 50),
                                 moment("timeout", 99)))[:2] == ("stall", 50)
    tie = analysed(moment("collision", 5), moment("excessive_force", 5))
    assert strict_class(tie, "collision") == ("collision", 5, True)
    assert strict_class(tie, "collision", give_ties=False) == ("excessive_force", 5, False)
    assert strict_class(tie, "stall") == ("excessive_force", 5, False)


def test_a_recovered_cause_is_a_strict_miss_but_a_lenient_hit_and_a_recovered_success_is_not_flagged():
    labels = [label("grasp_miss", 0, "grasp_miss", False), label("success", 0, None, True),
              label("success", 1, None, True), label("success_expert", 0, None, False)]
    events = {"grasp_miss-0": analysed(moment("grasp_miss", 10, recovered=20), moment("stall", 50)),
              "success-0": analysed(moment("grasp_miss", 30, recovered=40)),
              "success-1": analysed(),
              "success_expert-0": analysed(moment("slip", 5))}  # a failed baseline: no known cause, not scored
    strict, lenient = score_strict(labels, events), score_lenient(labels, events)
    assert strict["per_type"]["grasp_miss"] | {"instead": None} == {
        "precision": 0.0, "recall": 0.0, "f1": 0.0, "tp": 0, "fp": 0, "fn": 1, "instead": None}
    assert strict["per_type"]["grasp_miss"]["instead"] == {"stall": 1}
    assert (strict["flagged"], strict["successes"]) == (0, 2)
    assert lenient["per_type"]["grasp_miss"]["tp"] == 1 and (lenient["flagged"], lenient["successes"]) == (1, 2)


def test_the_split_keeps_a_repeated_cases_first_seeds_for_tuning():
    labels = [label("grasp_miss", s, "grasp_miss", False) for s in (0, 9, 10, 29)]
    labels += [label("success", s, None, True) for s in (0, 29, 30, 89)]  # run 3 times per seed
    tuning, held = split(labels, 10)
    assert [(lab.case, lab.seed) for lab in tuning] == [("grasp_miss", 0), ("grasp_miss", 9), ("success", 0),
                                                        ("success", 29)]
    assert [(lab.case, lab.seed) for lab in held] == [("grasp_miss", 10), ("grasp_miss", 29), ("success", 30),
                                                      ("success", 89)]
