"""A policy that sees pixels, the whole path at toy size: oracle demonstrations recorded with two
cameras, exported as a LeRobot dataset, trained for a few steps in the LeRobot venv through
LeRobotDataset, served over openpi's protocol, and driven by the rollout loop as a user's VLA is.
Its server answers a malformed observation with the reason and goes on serving. Nothing is timed;
bench/learned.py measures what such policies achieve."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import numpy as np
from openpi_client import msgpack_numpy
from websockets.sync.client import connect

import producers.sim  # noqa: F401  (headless GL before mujoco)
from consumers.exports.lerobot import export_lerobot
from consumers.exports.output import ExportFilters
from infra.policy_servers import answers, local_policies, log_path, start_policy_servers, stop_policy_servers
from infra.settings import Settings
from producers.keyframes import KeyframeStore
from producers.recorder import EpisodeIdentity, record_episode
from producers.sim.envs import make_env
from producers.sim.models import ModelConfig
from producers.sim.policies import OracleScripted
from producers.sim.rollout import Episode
from producers.websocket_policy import WebSocketPolicy
from schemas.scenario import ScenarioSpec
from tests.store_events import Collect, store_events

ROOT = Path(__file__).resolve().parents[2]
CAMERAS = ("agentview", "robot0_eye_in_hand")
SIZE = 32
# The server's keys -> what the rollout loop gives: the cameras' frames, and the Step's signals that
# make up the export's observation.state, in its order.
LAYOUT = {"observation/images/agentview": ("agentview_image",),
          "observation/images/robot0_eye_in_hand": ("robot0_eye_in_hand_image",),
          "observation/state": ("joint_pos", "eef_pos", "eef_quat", "gripper_opening")}


# producers.learned.train.load_samples against what LeRobotDataset gives item by item with the
# training's delta_timestamps (the previous frame's state, a chunk of 4 actions)
SAME_AS_LEROBOT_ITEMS = """
import json, sys, torch
from pathlib import Path
from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata
from producers.learned.train import load_samples
root, cameras = Path(sys.argv[1]), ("agentview", "robot0_eye_in_hand")
ours = load_samples(root, cameras, None, 4)
fps = LeRobotDatasetMetadata("sepa/export", root=root).fps
ds = LeRobotDataset("sepa/export", root=root, video_backend="pyav",
                    delta_timestamps={"observation.state": [-1 / fps], "action": [i / fps for i in range(4)]})
items = [ds[i] for i in range(len(ds))]
equal = (all(torch.equal(ours["images"][c][i], (item[f"observation.images.{c}"] * 255).round().to(torch.uint8))
             for c in cameras for i, item in enumerate(items))
         and torch.equal(ours["state"], torch.stack([item["observation.state"][0] for item in items]))
         and torch.equal(ours["action"], torch.stack([item["action"] for item in items]))
         and torch.equal(ours["pad"], torch.stack([item["action_is_pad"] for item in items]))
         and ours["task"] == [item["task"] for item in items])
print(json.dumps({"frames": len(items), "equal": equal}))
"""


def test_a_pixel_policy_trains_on_our_export_and_is_served_like_a_vla(lerobot_venv, store, tmp_path):
    spec = ScenarioSpec(env_name="Lift", horizon=80, instruction="lift the cube")
    env = make_env(spec, keyframes=True)
    keyframes, sink = KeyframeStore(tmp_path / "keyframes"), Collect()
    for seed in (0, 1):
        identity = EpisodeIdentity(run_id="demos", benchmark="robosuite", task="Lift", scenario=spec.to_dict(),
                                   model_id="oracle", model_version="1", seed=seed)
        summary = record_episode(Episode(env, OracleScripted(), seed, cameras=CAMERAS, camera_size=SIZE), sink,
                                 identity, keyframes)
        assert summary.success
    store_events(store, sink.events)
    demos, policy_dir = tmp_path / "demos", tmp_path / "policy"
    summary = export_lerobot(store, demos, tmp_path / "keyframes", ExportFilters(outcome="success", model_id="oracle"))
    assert summary.episodes == 2

    venv_env = lerobot_venv.environ(ROOT)
    # training reads an episode at a time; LeRobotDataset item by item must give the same tensors
    same = subprocess.run([str(lerobot_venv.python), "-c", SAME_AS_LEROBOT_ITEMS, str(demos)], env=venv_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert same.returncode == 0, same.stderr[-3000:]
    assert json.loads(same.stdout.splitlines()[-1]) == {"frames": summary.frames, "equal": True}, same.stdout[-2000:]
    train = subprocess.run([str(lerobot_venv.python), "-m", "producers.learned.train", "--dataset", str(demos),
                            "--output", str(policy_dir), "--steps", "5", "--batch", "4", "--chunk", "4"],
                           env=venv_env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    record = json.loads((policy_dir / "policy.json").read_text())
    assert record["training"]["episodes"] == 2 and record["training"]["steps"] == 5
    assert len(record["training"]["dataset_sha256"]) == 64 and record["policy"]["cameras"] == list(CAMERAS)

    server = subprocess.Popen([str(lerobot_venv.python), "-m", "producers.learned.server", "--policy",
                               str(policy_dir)], env=venv_env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        died = server.stderr.read()[-3000:] if server.poll() is not None else ""
        assert "serving policy on ws://127.0.0.1:" in line, (line, died)
        uri = line.split(" on ")[1].strip()

        # a malformed observation gets the reason, and the server serves the next one
        with connect(uri, compression=None, max_size=None) as ws:
            metadata = msgpack_numpy.unpackb(ws.recv())
            assert metadata["cameras"] == list(CAMERAS) and metadata["chunk"] == 4
            ws.send(msgpack_numpy.packb({"observation/state": np.zeros(3), "prompt": "lift the cube"}))
            reply = msgpack_numpy.unpackb(ws.recv())
            assert "actions" not in reply and "observation/images/agentview must be uint8 (32, 32, 3)" in reply["error"]
            ws.send(b"\x00not msgpack")
            assert "unreadable request" in msgpack_numpy.unpackb(ws.recv())["error"]
        with connect(uri, compression=None, max_size=None) as gone:  # a client that goes without a close frame
            gone.recv()
            gone.socket.close()

        # the rollout loop drives it as it drives any websocket model
        policy = WebSocketPolicy(uri, env.action_dim, observation=LAYOUT)
        episode = Episode(env, policy, 1_000_000, policy_cameras=CAMERAS, policy_camera_size=SIZE)
        steps = list(episode)
        policy.close()
        assert episode.outcome.termination in ("success", "timeout"), episode.outcome.error
        assert len(steps) == episode.outcome.steps > 0
        assert server.poll() is None  # alive after all of it
    finally:
        server.terminate()
        server.wait(timeout=30)
        env.close()

    # `up` starts the server of a registered learned policy on its uri's port, `down` stops it
    settings = Settings(memory_dir=tmp_path / "memory")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = ModelConfig(model_id="pixel-bc", version="1", kind="websocket", uri=f"ws://127.0.0.1:{port}",
                        action_dim=env.action_dim, policy=str(policy_dir), cameras=CAMERAS, camera_size=SIZE)
    wanted = local_policies([model])
    assert [(p.model_id, p.port) for p in wanted] == [("pixel-bc", port)]
    pids = start_policy_servers(settings, wanted, venv=lerobot_venv)
    try:
        assert list(pids) == ["pixel-bc"] and answers("127.0.0.1", port)
        with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
            assert msgpack_numpy.unpackb(ws.recv())["cameras"] == list(CAMERAS)
        # a second `up` starts nothing: its server runs (and a server the user runs is left alone)
        assert start_policy_servers(settings, wanted, pids, venv=lerobot_venv) == {}
        assert start_policy_servers(settings, wanted, {}, venv=lerobot_venv) == {}
    finally:
        stopped = stop_policy_servers(pids)
    assert stopped == ["pixel-bc"] and not answers("127.0.0.1", port)
    assert "serving" in log_path(settings, "pixel-bc").read_text()


def test_a_small_budget_of_multi_task_demonstrations_covers_every_task(lerobot_venv):
    # episodes 0-2 are one task's, 3-4 another's, 5 a third's: two episodes are the first of the
    # first two tasks, four reach the third task before any task's third episode
    code = ("import json; from producers.learned.train import balanced_episodes as b; "
            "t = [['a'], ['a'], ['a'], ['b'], ['b'], ['c']]; print(json.dumps([b(t, 2), b(t, 4), b(t, 9), "
            "b([['a']] * 5, 3)]))")
    out = subprocess.run([str(lerobot_venv.python), "-c", code], env=lerobot_venv.environ(ROOT), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [[0, 3], [0, 1, 3, 5], [0, 1, 2, 3, 4, 5], [0, 1, 2]]
