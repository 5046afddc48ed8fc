"""models.yaml entries of kind "websocket": an openpi policy server with its action dim and the
observation layout it expects; refused with the entry and the value at fault when malformed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from producers.sim.exceptions import ModelConfigError
from producers.sim.models import load_models, registered_models, skill_order

ORACLE = """  - model_id: oracle
    version: "1"
    kind: oracle
    rank: 0
    skill: {}
"""


def registry(tmp_path: Path, entry: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n" + ORACLE + entry)
    return path


VLA = """  - model_id: my-vla
    version: "3"
    kind: websocket
    description: an external policy
    uri: ws://127.0.0.1:8000
    action_dim: 7
    observation: {observation/state: [robot0_eef_pos, robot0_gripper_qpos], observation/goal: goal_pos}
"""


def test_a_websocket_entry_names_its_server_and_makes_a_websocket_policy(tmp_path):
    oracle, vla = load_models(registry(tmp_path, VLA))
    assert (vla.kind, vla.uri, vla.action_dim, vla.rank, vla.skill) == ("websocket", "ws://127.0.0.1:8000", 7,
                                                                          None, None)
    assert vla.observation == {"observation/state": ("robot0_eef_pos", "robot0_gripper_qpos"),
                               "observation/goal": ("goal_pos",)}
    assert skill_order([oracle, vla]) == ["oracle"]  # no rank: not part of the known skill order
    params = vla.params()
    assert params["uri"] == "ws://127.0.0.1:8000" and params["action_dim"] == "7"
    assert json.loads(params["observation"])["observation/state"] == ["robot0_eef_pos", "robot0_gripper_qpos"]
    policy = vla.make_policy()  # connects on the first reset, not here
    assert (type(policy).__name__, policy.name, policy.action_dim) == ("WebSocketPolicy", "my-vla", 7)
    request = policy._layout({"robot0_eef_pos": np.array([0.1, 0.2, 0.3]), "robot0_gripper_qpos": np.array([0.04]),
                              "goal_pos": np.array([0.0, 0.0, 1.0]), "object-state": np.zeros(10)})
    assert sorted(request) == ["observation/goal", "observation/state"]
    assert request["observation/state"].tolist() == [0.1, 0.2, 0.3, 0.04]


@pytest.mark.parametrize("change, error", [
    ("    uri: http://127.0.0.1:8000\n", r"uri must be a ws:// or wss:// address, got 'http://127.0.0.1:8000'"),
    ("    action_dim: 0\n", r"action_dim must be a positive integer, got 0"),
    ("    rank: 5\n", r"unknown keys \['rank'\]"),
    ("    skill: {action_noise: 0.1}\n", r"unknown keys \['skill'\]"),
    ("    observation: {prompt: robot0_eef_pos}\n", r"'prompt' is the instruction's"),
    ("    observation: {observation/state: []}\n", r"must be an observation key or a list of them"),
    ("    batch: 0\n", r"batch must be an integer from 1 to 64, got 0"),
    ("    concurrency: two\n", r"concurrency must be an integer from 1 to 64, got 'two'"),
    ("    batch: 16\n    concurrency: 8\n", r"batch x concurrency = 128 envs per rollout process, more than 64"),
    ("    cameras: agentview\n", r"cameras must be a list of distinct camera names, got 'agentview'"),
    ("    cameras: [agentview, agentview]\n", r"cameras must be a list of distinct camera names"),
    ("    camera_size: 8\n", r"camera_size must be an integer from 16 to 1024, got 8"),
])
def test_a_malformed_websocket_entry_is_refused_naming_the_entry_and_value(tmp_path, change, error):
    lines = [line for line in VLA.splitlines(keepends=True)
             if not line.strip().startswith(change.strip().split(":")[0] + ":")]
    with pytest.raises(ModelConfigError, match=r"models\[1\].*" + error):
        load_models(registry(tmp_path, "".join(lines) + change))


def test_a_missing_server_and_a_scripted_entry_with_a_server_are_refused(tmp_path):
    no_uri = "".join(line for line in VLA.splitlines(keepends=True) if "uri:" not in line)
    with pytest.raises(ModelConfigError, match=r"models\[1\] \(kind 'websocket'\): missing keys \['uri'\]"):
        load_models(registry(tmp_path, no_uri))
    scripted = """  - model_id: s
    version: "1"
    kind: scripted
    skill: {action_noise: 0.1}
    uri: ws://127.0.0.1:8000
"""
    with pytest.raises(ModelConfigError, match=r"models\[1\] \(kind 'scripted'\): .*unknown keys \['uri'\]"):
        load_models(registry(tmp_path, scripted))


def test_a_layout_naming_an_observation_the_simulator_lacks_is_a_policy_error():
    from producers.websocket_policy import PolicyServerError, WebSocketPolicy

    policy = WebSocketPolicy("ws://127.0.0.1:1", 7, observation={"observation/image": ("agentview_image",)})
    with pytest.raises(PolicyServerError, match="expects 'observation/image' from observation 'agentview_image'"):
        policy._layout({"robot0_eef_pos": np.zeros(3)})


def test_the_registry_a_rollout_process_reads_is_parsed_again_when_the_file_changes(tmp_path):
    path = registry(tmp_path, VLA)
    assert sorted(registered_models(path)) == ["my-vla", "oracle"]
    assert registered_models(path) == registered_models(path)  # the same file: parsed once
    path.write_text("models:\n" + ORACLE)  # a model dropped (the file's size changes)
    assert sorted(registered_models(path)) == ["oracle"]
    path.write_text("models:\n  - model_id: x\n")
    with pytest.raises(ModelConfigError):
        registered_models(path)
    with pytest.raises(ModelConfigError, match="cannot read"):
        registered_models(tmp_path / "missing.yaml")


def test_batch_and_concurrency_set_the_lanes_and_leave_the_registration_alone(tmp_path):
    _, plain = load_models(registry(tmp_path, VLA))
    _, batched = load_models(registry(tmp_path, VLA + "    batch: 8\n    concurrency: 2\n"))
    assert (plain.batch, plain.concurrency, plain.lanes) == (1, 1, 1)
    assert (batched.batch, batched.concurrency, batched.lanes) == (8, 2, 16)
    assert batched.params() == plain.params()  # the same episodes: the same model, re-batched
    scripted = """  - model_id: s
    version: "1"
    kind: scripted
    skill: {action_noise: 0.1}
    batch: 4
"""
    with pytest.raises(ModelConfigError, match=r"models\[1\] \(kind 'scripted'\): .*unknown keys \['batch'\]"):
        load_models(registry(tmp_path, scripted))


def test_a_pixel_policy_names_its_cameras_in_the_registration_and_gets_images_unflattened(tmp_path):
    entry = VLA.replace("observation: {", "cameras: [agentview]\n    camera_size: 32\n    observation: "
                                          "{observation/image: agentview_image, ")
    _, vla = load_models(registry(tmp_path, entry))
    assert (vla.cameras, vla.camera_size) == (("agentview",), 32)
    assert json.loads(vla.params()["cameras"]) == ["agentview"] and vla.params()["camera_size"] == "32"
    image = np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)
    request = vla.make_policy()._layout({"agentview_image": image, "robot0_eef_pos": np.zeros(3),
                                         "robot0_gripper_qpos": np.zeros(1), "goal_pos": np.zeros(3)})
    assert request["observation/image"].dtype == np.uint8 and np.array_equal(request["observation/image"], image)
    scripted = """  - model_id: s
    version: "1"
    kind: scripted
    skill: {action_noise: 0.1}
    cameras: [agentview]
"""
    with pytest.raises(ModelConfigError, match=r"unknown keys \['cameras'\]"):
        load_models(registry(tmp_path, scripted))


def test_a_layout_may_name_the_steps_signals_and_the_observation_wins_a_shared_name():
    from producers.websocket_policy import WebSocketPolicy

    policy = WebSocketPolicy("ws://127.0.0.1:1", 7, observation={"observation/state": ("joint_pos", "gripper_opening"),
                                                                 "observation/eef": ("eef_pos",)})
    signals = {"joint_pos": [0.1, 0.2], "gripper_opening": 0.04, "eef_pos": [9.0, 9.0, 9.0]}
    request = policy._layout({"eef_pos": np.array([1.0, 2.0, 3.0])}, signals)
    assert request["observation/state"].tolist() == [0.1, 0.2, 0.04]
    assert request["observation/eef"].tolist() == [1.0, 2.0, 3.0]


def test_a_trained_policy_names_its_training_in_the_registration(tmp_path):
    trained = tmp_path / "pixel-bc"
    trained.mkdir()
    (trained / "policy.json").write_text(json.dumps({"policy": {}, "normalizer": {}, "training": {
        "dataset_sha256": "ab" * 32, "episodes": 30, "steps": 1500, "seed": 0, "wall_s": 201.5, "load_s": 39.0,
        "dataset": "/somewhere/demos"}}))
    _, vla = load_models(registry(tmp_path, VLA + f"    policy: {trained}\n"))
    training = json.loads(vla.params()["training"])
    assert training == {"dataset_sha256": "ab" * 32, "episodes": 30, "steps": 1500, "seed": 0}  # no wall times
    with pytest.raises(ModelConfigError, match=r"models\[1\].*policy '.*nowhere' is not a trained policy's directory"):
        load_models(registry(tmp_path, VLA + f"    policy: {tmp_path / 'nowhere'}\n"))
