"""Critics and gate on LIBERO candidates, over a real broker, the real sink and a chDB store, the
rollouts served by the loop's stand-in (tests/loop_harness.py): the robustness critic asks for the
LIBERO candidate and its LIBERO parent (the control arm, read back from the log) in requests only
the LIBERO worker serves, safety and semantic follow, and the gate promotes or rejects as it does
for robosuite; the promotion carries a LIBERO scenario. (The LIBERO worker serving such requests
for real: tests/integration/test_libero.py.)"""

from __future__ import annotations

import json

from loop_harness import LoopWorld, always, harder_for, never

from consumers import state as q
from producers.libero.mutations import layout, material
from producers.rollout_worker import serves
from schemas.libero_scenario import LiberoScenario

SOUP = LiberoScenario(suite="libero_object", env_name="pick_up_the_alphabet_soup_and_place_it_in_the_basket",
                      instruction="pick up the alphabet soup and place it in the basket", horizon=280)
BASE = SOUP.to_dict()
GOOD = material(SOUP, friction=0.2).to_dict()  # the weak model loses every seed, the strong one none
BAD = layout(SOUP, dx_m=0.15).to_dict()  # the oracle cannot solve it
LOOK = 5


def test_critics_and_gate_decide_libero_candidates_with_the_libero_parent_as_control(tansu, store, tmp_path):
    ids = {k: s["scenario_id"] for k, s in (("base", BASE), ("good", GOOD), ("bad", BAD))}
    world = LoopWorld(tansu, store, tmp_path, {ids["base"]: always, ids["good"]: harder_for("weak"),
                                               ids["bad"]: never}).start()
    try:
        world.register()
        world.promote_base(BASE)
        world.sweep(BASE, range(LOOK))
        critics = world.critics().start()
        world.propose(GOOD, factor="friction", seconds=10)
        world.propose(BAD, factor="pose", seconds=11)
        world.until(lambda: set(world.verdicts(ids["good"])) == {"robustness", "safety", "semantic"}
                    and "robustness" in world.verdicts(ids["bad"]), "the LIBERO candidates' verdicts")
        critics.stop()

        good, bad = world.verdicts(ids["good"]), world.verdicts(ids["bad"])
        assert good["robustness"].passed is True and good["safety"].passed is True
        assert bad["robustness"].passed is False
        validation = [r for r in world.responder.requests if r["purpose"] == "validation"]
        assert validation and all(serves(r, ("libero",)) and not serves(r, ("robosuite",)) for r in validation)
        control = [r for r in validation if r["scenario_id"] == ids["base"]]
        assert control and {r["model_id"] for r in control} == {"strong", "weak"}
        for r in validation:  # every scenario sent, the parent's read back from the log, is the LIBERO scenario
            spec = LiberoScenario.from_dict(dict(r["scenario"]))
            assert spec.scenario_id == r["scenario_id"]

        decided = {d["scenario_id"]: d for d in world.tick_gate()}
        assert decided[ids["good"]]["envelope"]["event_type"] == "Promoted"
        assert decided[ids["bad"]]["envelope"]["event_type"] == "Rejected"
        promoted = LiberoScenario.from_dict(dict(decided[ids["good"]]["scenario"]))
        assert promoted.parent_id == ids["base"] and promoted.perturbations == {"material.target.friction": 0.2}
        world.until(lambda: ids["good"] in q.active_scenarios(store), "the promotion in the log")
        active = q.active_benchmark(store)
        spec = next(a.spec for a in active.scenarios if a.scenario_id == ids["good"])
        assert LiberoScenario.from_dict(dict(spec)).scenario_id == ids["good"]
        assert json.loads(good["robustness"].evidence_json)["look"] >= 1
        assert world.dead_letters() == []
    finally:
        world.stop()
