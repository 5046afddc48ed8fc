"""The LIBERO worker's request handling and the launcher's preconditions (no LIBERO needed)."""

from __future__ import annotations

import json
from concurrent.futures.process import BrokenProcessPool

import pytest

from infra.libero_venv import ROOT, LiberoVenv
from infra.libero_worker import ready_file_of, start_libero_worker, worker_command, worker_environ
from infra.settings import load_settings
from producers.libero.exceptions import LiberoError
from producers.libero.worker import POOL_ATTEMPTS, LiberoModel, LiberoWorker, load_libero_models
from producers.rollout_worker import rollout_request
from producers.sim.policies import Skill
from schemas.exceptions import LiberoScenarioError
from schemas.libero_scenario import LiberoScenario
from schemas.scenario import ScenarioSpec


class Pool:
    def __init__(self, deaths: int = 0):
        self.models = {"oracle": LiberoModel("oracle", "1", "oracle", skill=Skill())}
        self.ran: list[dict] = []
        self.deaths, self.restarts = deaths, 0

    def run(self, request):
        self.ran.append(request)
        if self.deaths:
            self.deaths -= 1
            raise BrokenProcessPool("A process in the process pool was terminated abruptly")
        return []

    def restart(self):
        self.restarts += 1


def spec() -> LiberoScenario:
    return LiberoScenario(suite="libero_object", env_name="pick_up_the_milk_and_place_it_in_the_basket",
                          instruction="pick up the milk and place it in the basket", horizon=50)


def test_requests_are_routed_validated_and_run():
    pool = Pool()
    worker = LiberoWorker(None, None, None, pool, "t.")
    lift = ScenarioSpec(env_name="Lift", horizon=20, instruction="lift the cube").to_dict()
    assert worker.handle(rollout_request(lift, "oracle", [0])) is None  # another benchmark's: skipped
    assert worker.handle(rollout_request(spec().to_dict(), "oracle", [0, 1])) == []
    assert len(pool.ran) == 1
    with pytest.raises(KeyError, match="not known to the LIBERO worker"):
        worker.handle(rollout_request(spec().to_dict(), "gpt-robot", [0]))
    edited = {**spec().to_dict(), "horizon": 51}
    with pytest.raises(LiberoScenarioError, match="does not match its content"):
        worker.handle(rollout_request(edited, "oracle", [0]))
    assert len(pool.ran) == 1


def test_a_pool_process_that_dies_gets_new_processes_and_the_request_runs_again():
    """The kernel killed a pool process for memory mid-request: the worker must not die with it."""
    pool = Pool(deaths=POOL_ATTEMPTS - 1)
    worker = LiberoWorker(None, None, None, pool, "t.")
    assert worker.handle(rollout_request(spec().to_dict(), "oracle", [0, 1])) == []
    assert (len(pool.ran), pool.restarts) == (POOL_ATTEMPTS, POOL_ATTEMPTS - 1)


def test_a_request_that_kills_every_pool_is_refused_naming_it():
    pool = Pool(deaths=POOL_ATTEMPTS)
    request = rollout_request(spec().to_dict(), "oracle", [0])
    with pytest.raises(LiberoError, match=f"{request['request_id']}: a pool process died on each of {POOL_ATTEMPTS}"):
        LiberoWorker(None, None, None, pool, "t.").handle(request)
    assert pool.restarts == POOL_ATTEMPTS


def test_models_are_the_registrys_scripted_ones_plus_policy_servers():
    models = load_libero_models(policy_servers={"pi0": "ws://127.0.0.1:8000"})
    assert {"oracle", "scripted-expert", "scripted-novice", "scripted-clumsy", "pi0"} <= set(models)
    assert models["pi0"].kind == "openpi" and models["oracle"].skill == Skill()
    with pytest.raises(ValueError, match="ws:// or wss://"):
        load_libero_models(policy_servers={"pi0": "http://127.0.0.1:8000"})


def test_a_registered_websocket_model_keeps_its_layout_and_cameras(tmp_path):
    """Not run as a scripted policy (it has no skill): as the robosuite worker runs it."""
    path = tmp_path / "models.yaml"
    path.write_text(json.dumps({"models": [
        {"model_id": "oracle", "version": "1", "kind": "oracle", "rank": 0,
         "skill": {"target_noise_m": 0.0, "action_noise": 0.0, "timing_jitter": 0.0, "precision": 1.0}},
        {"model_id": "pixel", "version": "2", "kind": "websocket", "uri": "ws://127.0.0.1:9", "action_dim": 7,
         "cameras": ["agentview"], "camera_size": 48, "observation": {"observation/state": ["eef_pos"]}}]}))
    models = load_libero_models(path)
    pixel = models["pixel"]
    assert pixel.kind == "websocket" and pixel.cameras == (("agentview",), 48)
    policy = pixel.make_policy()
    assert policy.uri == "ws://127.0.0.1:9" and policy.observation == {"observation/state": ("eef_pos",)}
    assert models["oracle"].cameras[0] == ()


def test_the_launcher_starts_nothing_without_a_libero_venv(tmp_path):
    settings = load_settings(environ={}, memory_dir=tmp_path)
    assert start_libero_worker(settings, "127.0.0.1:1", cache_root=tmp_path / "nothing") is None
    venv = LiberoVenv.at(tmp_path)
    env = worker_environ(settings, "127.0.0.1:9", venv)
    assert env["SEPA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9" and env["LIBERO_CONFIG_PATH"] == str(venv.config_dir)
    assert env["PYTHONPATH"] == str(ROOT)  # this checkout's code, whatever the venv has installed
    cmd = worker_command(venv, tmp_path / "ready", 3, {"pi0": "ws://h:1"})
    assert cmd[:3] == [str(venv.python), "-m", "infra.libero_worker"] and "pi0=ws://h:1" in cmd


def test_the_worker_is_told_absolute_paths_under_a_relative_memory_dir(tmp_path, monkeypatch):
    # `up` starts the worker in the run dir: a relative ready file or memory dir would name paths
    # under the run dir itself (eval_memory/run/eval_memory/...), and the worker died at ready.
    monkeypatch.chdir(tmp_path)
    settings = load_settings(environ={"SEPA_MODELS_FILE": "my-models.yaml"}, memory_dir="eval_memory")
    assert ready_file_of(settings) == tmp_path / "eval_memory" / "run" / ready_file_of(settings).name
    env = worker_environ(settings, "127.0.0.1:9", LiberoVenv.at(tmp_path))
    assert env["SEPA_MEMORY_DIR"] == str(tmp_path / "eval_memory")
    assert env["SEPA_MODELS_FILE"] == str(tmp_path / "my-models.yaml")  # the registry `up` serves
