"""Which registered models `up` serves itself, and what it says when it cannot."""

import json

import pytest

from infra.exceptions import LeRobotSetupError
from infra.lerobot_venv import LeRobotVenv
from infra.policy_servers import local_policies, start_policy_servers
from infra.settings import Settings
from producers.sim.models import ModelConfig, Skill


@pytest.fixture
def policy_dir(tmp_path):
    """A trained policy's directory as models.yaml checks it: its policy.json with a training record."""
    (tmp_path / "bc").mkdir()
    (tmp_path / "bc" / "policy.json").write_text(json.dumps({"training": {"steps": 5}}))
    return str(tmp_path / "bc")


def websocket(model_id: str, uri: str, policy: str | None) -> ModelConfig:
    return ModelConfig(model_id=model_id, version="1", kind="websocket", uri=uri, action_dim=7, policy=policy)


def test_only_learned_policies_on_this_host_are_served_here(policy_dir):
    models = [websocket("local", "ws://127.0.0.1:8123", policy_dir),
              websocket("named", "ws://localhost:8124", policy_dir),
              websocket("remote", "ws://10.0.0.7:8000", policy_dir), websocket("no-port", "ws://127.0.0.1", policy_dir),
              websocket("tls", "wss://127.0.0.1:8125", policy_dir), websocket("users-vla", "ws://127.0.0.1:8126", None),
              ModelConfig(model_id="expert", version="1", kind="scripted", skill=Skill(), rank=1)]
    served = local_policies(models)
    assert [(p.model_id, p.host, p.port, p.uri) for p in served] == [
        ("local", "127.0.0.1", 8123, "ws://127.0.0.1:8123"), ("named", "localhost", 8124, "ws://localhost:8124")]


def test_a_learned_policy_without_the_lerobot_venv_is_refused_naming_the_fix(tmp_path, policy_dir):
    wanted = local_policies([websocket("local", "ws://127.0.0.1:1", policy_dir)])
    with pytest.raises(LeRobotSetupError, match=r"models local are learned policies .* `sepa-eval lerobot setup`"):
        start_policy_servers(Settings(memory_dir=tmp_path), wanted,
                             venv=LeRobotVenv(tmp_path / "no-venv"))


def test_nothing_to_serve_needs_no_venv(tmp_path):
    assert start_policy_servers(Settings(memory_dir=tmp_path), [], venv=LeRobotVenv(tmp_path / "no-venv")) == {}
