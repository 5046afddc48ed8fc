"""LIBERO scenarios, tasks and mutations: pure parts, no LIBERO needed (runs in the project's venv)."""

from __future__ import annotations

import io
import pickle
import zipfile

import numpy as np
import pytest

from producers.libero.exceptions import LiberoTaskError
from producers.libero.mutations import PROBE, distractor, layout, material, paraphrase, paraphrases
from producers.libero.tasks import TaskCatalog, language_from_task_name, load_init_states, parse_sexpr
from producers.rollout_worker import serves
from schemas.codec import Codec
from schemas.events import make_event
from schemas.exceptions import LiberoScenarioError, ScenarioError
from schemas.libero_scenario import INIT_STATES_PER_TASK, LiberoScenario, is_libero, parse_perturbation
from schemas.scenario import ScenarioSpec

TASK = "pick_up_the_ketchup_and_place_it_in_the_basket"


def base() -> LiberoScenario:
    return LiberoScenario(suite="libero_object", env_name=TASK, instruction="pick up the ketchup and place it in "
                          "the basket", horizon=280)


def test_the_id_is_a_content_hash_and_a_mutation_is_a_child():
    spec = base()
    assert spec.scenario_id == base().scenario_id
    assert spec.scenario_id.startswith("scn-") and len(spec.scenario_id) == 20
    child = spec.perturb(**{"layout.target.dx_m": 0.04})
    assert child.parent_id == spec.scenario_id and child.scenario_id != spec.scenario_id
    # parent_id is not content: the same variant made from another parent has the same id
    assert LiberoScenario(**{**child.__dict__, "parent_id": None}).scenario_id == child.scenario_id
    # every field of the content counts
    for change in ({"init_state_index": 3}, {"horizon": 100}, {"instruction": "put the ketchup in the basket"},
                   {"suite": "libero_90"}, {"success_hold_steps": 5}):
        assert LiberoScenario(**{**spec.__dict__, **change}).scenario_id != spec.scenario_id


def test_the_avro_record_round_trips_through_the_codec():
    spec = base().perturb(**{"material.target.mass_scale": 2.0, "distractor.milk.x_m": 0.1,
                             "distractor.milk.y_m": -0.1, "camera.agentview.pitch_rad": 0.05})
    event = make_event("RolloutRequested", ("r",), "test", "test", request_id="r", scenario_id=spec.scenario_id,
                       scenario=spec.to_dict(), model_id="oracle", seeds=[0, 1], purpose="adhoc", keyframe_every=0)
    codec = Codec()
    decoded = codec.decode(codec.encode(event))
    assert LiberoScenario.from_dict(decoded["scenario"]) == spec
    assert is_libero(decoded["scenario"])
    assert serves(decoded, ("robosuite",)) is False and serves(decoded, ("libero",)) is True


def test_each_benchmark_refuses_the_others_scenarios():
    robosuite = ScenarioSpec(env_name="Lift", horizon=50, instruction="lift the cube").to_dict()
    with pytest.raises(LiberoScenarioError, match="benchmark must be 'libero'"):
        LiberoScenario.from_dict(robosuite)
    with pytest.raises(ScenarioError):
        ScenarioSpec.from_dict(base().to_dict())
    assert serves({"scenario": robosuite}, ("robosuite",))


def test_an_edited_record_or_a_robosuite_field_is_refused():
    record = base().to_dict()
    with pytest.raises(LiberoScenarioError, match="does not match its content"):
        LiberoScenario.from_dict({**record, "horizon": 99})
    with pytest.raises(LiberoScenarioError, match="object_mass is a robosuite scenario field"):
        LiberoScenario.from_dict({**record, "object_mass": 1.0})
    with pytest.raises(LiberoScenarioError, match="unknown scenario keys"):
        LiberoScenario.from_dict({**record, "colour": "red"})


@pytest.mark.parametrize("name, value, message", [
    ("layout.target.dz_m", 0.1, "layout takes the parameters"),
    ("layout.target.dx_m", 0.5, r"must be in \[-0.2, 0.2\]"),
    ("layout.Target.dx_m", 0.1, "lower case"),
    ("sound.all.volume", 1.0, "axis must be one of"),
    ("camera.frontview.dx_m", 0.1, "camera must be one of"),
    ("light.lamp.diffuse_scale", 1.0, "apply to 'all' lights"),
    ("material.target.friction", float("nan"), "finite number"),
    ("distractor.milk.x_m", 0.1, "needs both x_m and y_m"),
])
def test_bad_perturbations_are_refused_with_the_reason(name, value, message):
    with pytest.raises(LiberoScenarioError, match=message):
        base().perturb(**{name: value})


def test_seeds_walk_the_stored_init_states():
    spec = LiberoScenario(**{**base().__dict__, "init_state_index": 48})
    assert [spec.init_state_for(s) for s in range(4)] == [48, 49, 0, 1]
    assert {base().init_state_for(s) for s in range(INIT_STATES_PER_TASK)} == set(range(INIT_STATES_PER_TASK))


def test_mutation_operators_name_their_perturbations():
    spec = base()
    assert layout(spec, dx_m=0.03, yaw_rad=0.5).perturbations == {"layout.target.dx_m": 0.03,
                                                                  "layout.target.yaw_rad": 0.5}
    assert material(spec, friction=0.3).perturbations == {"material.target.friction": 0.3}
    assert distractor(spec, "milk", 0.1, -0.2).perturbations == {"distractor.milk.x_m": 0.1,
                                                                 "distractor.milk.y_m": -0.2}
    with pytest.raises(ValueError, match="distractor category"):
        distractor(spec, "piano", 0.0, 0.0)
    p = paraphrase(spec, 0)
    assert p.instruction == "put the ketchup in the basket" and p.parent_id == spec.scenario_id
    assert paraphrases("open the top drawer of the cabinet") == []
    for axis, op in PROBE.items():
        child = op(spec)
        assert child.parent_id == spec.scenario_id, axis
        LiberoScenario.from_dict(child.to_dict())
    assert parse_perturbation("light.all.ambient").parameter == "ambient"


def test_task_language_and_bddl_goal_as_libero_reads_them(tmp_path):
    assert language_from_task_name(TASK) == "pick up the ketchup and place it in the basket"
    assert language_from_task_name("LIVING_ROOM_SCENE2_put_both_the_alphabet_soup_and_the_tomato_sauce_in_the_basket") \
        == "put both the alphabet soup and the tomato sauce in the basket"
    assert language_from_task_name("KITCHEN_SCENE10_put_the_butter_at_the_back") == "put the butter at the back"
    pkg = tmp_path / "libero"
    (pkg / "benchmark").mkdir(parents=True)
    (pkg / "benchmark" / "libero_suite_task_map.py").write_text(f"libero_task_map = {{'libero_object': ['{TASK}']}}\n")
    (pkg / "bddl_files" / "libero_object").mkdir(parents=True)
    (pkg / "bddl_files" / "libero_object" / f"{TASK}.bddl").write_text(
        "(define (problem LIBERO_Floor_Manipulation)\n (:domain robosuite)\n (:language Pick the ketchup) ; note\n"
        " (:objects ketchup_1 - ketchup basket_1 - basket milk_1 milk_2 - milk)\n"
        " (:obj_of_interest ketchup_1 basket_1)\n (:goal (And (In ketchup_1 basket_1_contain_region))))\n")
    catalog = TaskCatalog(pkg)
    assert catalog.tasks("libero_object") == [TASK] and catalog.tasks("libero_90") == []
    info = catalog.info("libero_object", TASK)
    assert info.objects == {"ketchup_1": "ketchup", "basket_1": "basket", "milk_1": "milk", "milk_2": "milk"}
    assert info.goal == (("in", "ketchup_1", "basket_1_contain_region"),)
    assert info.target == "ketchup_1" and info.pick_and_place
    assert catalog.base_scenario("libero_object", TASK).instruction == info.instruction
    with pytest.raises(LiberoTaskError, match="is not a task of libero_object"):
        catalog.info("libero_object", "fly_to_the_moon")
    with pytest.raises(ValueError, match="unbalanced"):
        parse_sexpr("(a (b)")


def _zip_with(payload: bytes, path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)


def test_init_states_are_read_as_numpy_and_nothing_else(tmp_path):
    states = np.arange(12, dtype=np.float64).reshape(3, 4)
    good = tmp_path / "good.pruned_init"
    _zip_with(pickle.dumps(states, protocol=2), good)
    assert np.array_equal(load_init_states(good), states)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    evil = tmp_path / "evil.pruned_init"
    _zip_with(pickle.dumps(Evil()), evil)
    with pytest.raises(LiberoTaskError, match="refusing to unpickle builtins.print"):
        load_init_states(evil)
    broken = tmp_path / "broken.pruned_init"
    broken.write_bytes(io.BytesIO(b"not a zip").getvalue())
    with pytest.raises(LiberoTaskError, match="cannot read LIBERO init states"):
        load_init_states(broken)


def test_the_adapter_names_tasks_by_suite(tmp_path):
    from producers.libero.adapter import LiberoAdapter

    pkg = tmp_path / "libero"
    (pkg / "benchmark").mkdir(parents=True)
    (pkg / "benchmark" / "libero_suite_task_map.py").write_text(f"libero_task_map = {{'libero_object': ['{TASK}']}}\n")
    (pkg / "bddl_files" / "libero_object").mkdir(parents=True)
    (pkg / "bddl_files" / "libero_object" / f"{TASK}.bddl").write_text(
        "(define (problem P) (:objects ketchup_1 - ketchup) (:goal (And (In ketchup_1 basket_1_contain_region))))")
    adapter = LiberoAdapter(TaskCatalog(pkg))
    assert adapter.tasks() == [f"libero_object/{TASK}"]
    record = adapter.base_scenario(f"libero_object/{TASK}", 100)
    assert record["benchmark"] == "libero" and record["horizon"] == 100 and record["suite"] == "libero_object"
    with pytest.raises(LiberoTaskError, match="<suite>/<task name>"):
        adapter.base_scenario(TASK)
