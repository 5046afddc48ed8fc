"""LIBERO end to end, in the LIBERO venv that `sepa-eval libero setup` builds (CI builds it first):
tasks listed from the venv's files, deterministic events across processes, the signal contract,
the worker -> topics -> evidence store -> detector path, and a worker killed mid-request losing no
episode. Real Tansu broker, real chDB store, real LIBERO.

Without a LIBERO venv these tests are skipped, unless SEPA_TEST_REQUIRE_LIBERO=1 (CI) makes that a
failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from sinks import drain

from infra.kafka_clients import ensure_topics, make_producer
from infra.libero_venv import LiberoVenv
from infra.libero_worker import start_libero_worker, worker_environ
from infra.settings import load_settings
from producers.libero.mutations import camera, distractor, layout, lighting, material
from producers.libero.tasks import TaskCatalog
from producers.publisher import Publisher
from producers.rollout_worker import rollout_request
from schemas.codec import Codec
from schemas.scenario import ScenarioSpec
from streams.failures.detector import DetectorConfig, EpisodeDetector

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "infra.cli"]
SOUP = 0  # libero_object task: pick up the alphabet soup (the oracle needs ~115 steps)


@pytest.fixture(scope="session")
def catalog(libero_venv) -> TaskCatalog:
    return TaskCatalog(libero_venv.package_dir)


def fresh_prefix(bootstrap: str) -> str:
    name = f"l{uuid.uuid4().hex[:10]}."
    ensure_topics(bootstrap, name)
    return name


def consume(bootstrap: str, topics: list[str], idle_s: float = 2.0, timeout_s: float = 60.0) -> list[dict]:
    codec = Codec()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    records: dict[tuple, dict] = {}
    try:
        metadata = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in metadata[t].partitions])
        start = last = time.monotonic()
        while time.monotonic() - start < timeout_s and time.monotonic() - last < idle_s:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                records[(msg.topic(), msg.partition(), msg.offset())] = codec.decode(msg.value())
                last = time.monotonic()
    finally:
        consumer.close()
    return [records[k] for k in sorted(records)]


def content(event: dict) -> dict:
    return {**event, "envelope": {k: v for k, v in event["envelope"].items() if k != "event_time"}}


def test_tasks_and_scenarios_come_from_the_venvs_files(libero_venv, tmp_path):
    env = {**os.environ, "SEPA_MEMORY_DIR": str(tmp_path)}
    stamp = libero_venv.stamp_path.read_text()
    again = subprocess.run(CLI + ["libero", "setup"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "LIBERO ready" in again.stdout, again.stderr
    assert libero_venv.stamp_path.read_text() == stamp  # idempotent: a ready venv is not rebuilt
    listed = subprocess.run(CLI + ["libero", "tasks", "--suite", "libero_object", "--json"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    tasks = json.loads(listed.stdout)
    assert len(tasks) == 10 and all(t["pick_and_place"] for t in tasks)
    assert tasks[SOUP]["instruction"] == "pick up the alphabet soup and place it in the basket"
    assert tasks[SOUP]["target"] == "alphabet_soup_1"
    made = subprocess.run(CLI + ["libero", "scenario", "--suite", "libero_object", "--task", "4",
                                 "--perturb", "layout.target.dx_m=0.03"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    from schemas.libero_scenario import LiberoScenario

    spec = LiberoScenario.from_dict(json.loads(made.stdout))
    assert spec.parent_id is not None and spec.perturbations == {"layout.target.dx_m": 0.03}
    bad = subprocess.run(CLI + ["libero", "scenario", "--suite", "libero_object", "--task", "4", "--perturb",
                                "layout.target.dz_m=1"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "layout takes the parameters" in bad.stderr


def test_the_cli_publishes_a_libero_rollout_request(libero_venv, tansu, tmp_path):
    prefix = fresh_prefix(tansu)
    env = {**os.environ, "SEPA_MEMORY_DIR": str(tmp_path), "SEPA_BOOTSTRAP_SERVERS": tansu,
           "SEPA_TOPIC_PREFIX": prefix}
    done = subprocess.run(CLI + ["libero", "request", "--suite", "libero_object", "--task", "7", "--model", "oracle",
                                 "--episodes", "3", "--seed", "10"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [request] = consume(tansu, [f"{prefix}rollout.requests"])
    assert request["seeds"] == [10, 11, 12] and request["model_id"] == "oracle"
    scenario = request["scenario"]
    assert scenario["benchmark"] == "libero" and scenario["env_name"].startswith("pick_up_the_milk")


def in_libero(venv: LiberoVenv, args: list[str], tmp_path: Path, bootstrap: str = "unused:0",
              prefix: str = "unused.") -> list[dict]:
    settings = load_settings(environ={}, memory_dir=tmp_path, bootstrap_servers=bootstrap, topic_prefix=prefix)
    proc = subprocess.run([str(venv.python), str(ROOT / "tests" / "integration" / "libero_episodes.py"), *args],
                          env=worker_environ(settings, bootstrap, venv), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_in_libero(venv: LiberoVenv, bootstrap: str, prefix: str, request: dict, seeds: list[int],
                  tmp_path: Path, servers: dict[str, str] | None = None, models: Path | None = None) -> list[dict]:
    path = tmp_path / f"request-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(request, default=str))
    extra = [f"--server={m}={u}" for m, u in (servers or {}).items()] + ([f"--models={models}"] if models else [])
    return in_libero(venv, ["record", bootstrap, prefix, str(path), *extra, *map(str, seeds)], tmp_path, bootstrap,
                     prefix)


@pytest.mark.slow  # six LIBERO envs and six oracle episodes: ~1 min on 2 cores
def test_perturbations_are_applied_and_the_feasibility_check_tells_a_broken_scene(libero_venv, catalog, tmp_path):
    base = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[SOUP], horizon=200)
    specs = {"base": base,
             "layout": layout(base, dx_m=0.04, yaw_rad=0.5),
             "material": material(base, friction=0.3, mass_scale=2.0),
             "pixels": lighting(camera(base, dx_m=0.1, pitch_rad=0.1), diffuse_scale=0.3),
             "crowded": distractor(base, "milk", 0.0, 0.0),
             # a second can where the target stands: interpenetration, or no room to grasp
             "broken": layout(base, dx_m=0.0).perturb(**{"distractor.alphabet_soup.x_m": -0.12,
                                                          "distractor.alphabet_soup.y_m": -0.24})}
    paths = []
    for name, spec in specs.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(spec.to_dict()))
        paths.append(str(path))
    got = dict(zip(specs, in_libero(libero_venv, ["probe", *paths], tmp_path), strict=True))
    b = got["base"]
    assert b["feasible"] and got["layout"]["feasible"] and got["crowded"]["feasible"], got
    moved = np.subtract(got["layout"]["target_pos"][:2], b["target_pos"][:2])
    assert moved[0] == pytest.approx(0.04, abs=0.01) and abs(moved[1]) < 0.01
    assert got["layout"]["target_quat"] != pytest.approx(b["target_quat"], abs=0.05)
    assert got["material"]["target_mass"] == pytest.approx(2 * b["target_mass"])
    assert got["material"]["target_friction"] == pytest.approx(0.3)
    assert got["pixels"]["agentview_pos"][0] == pytest.approx(b["agentview_pos"][0] + 0.1)
    assert got["pixels"]["light_diffuse"] == pytest.approx(0.3 * b["light_diffuse"])
    assert got["pixels"]["frame_mean"] < b["frame_mean"] - 5  # darker: what a pixel policy sees changed
    assert got["pixels"]["target_pos"] == pytest.approx(b["target_pos"], abs=1e-6)  # and nothing else
    assert got["crowded"]["names"][-1] == "milk_91"
    assert not got["broken"]["feasible"] and got["broken"]["reasons"], got["broken"]


@pytest.mark.slow  # two LIBERO envs and their GL contexts: ~30 s on 2 cores
def test_one_env_per_process_holds_gl_contexts_and_frames_survive_remaking_them(libero_venv, catalog, tmp_path):
    """A GL context holds a LIBERO scene's textures (~500 MB each): an env renders every frame size
    through one, a pool process keeps only the rendering env's, and the env it freed renders the
    very same frames (and mujoco.Renderer's) once it renders again."""
    base = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[SOUP], horizon=40)
    paths = []
    for name, spec in {"first": base, "second": camera(base, dx_m=0.05)}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(spec.to_dict()))
        paths.append(str(tmp_path / f"{name}.json"))
    got = in_libero(libero_venv, ["frames", *paths], tmp_path)
    assert got == {"held_after_first": [True, False], "held_after_second": [False, True], "same_frames": True,
                   "same_as_mujoco_renderer": True}


def test_same_scenario_model_and_seed_give_the_same_events_in_any_process(libero_venv, catalog, tansu, tmp_path):
    """A perturbed scenario (every model-level axis) and a noisy policy: process A runs seeds 0
    then 1 in one env, process B seed 1 in a fresh one; seed 1's events are identical."""
    base = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[SOUP], horizon=40)
    spec = lighting(material(layout(distractor(base, "milk", 0.0, 0.0), dx_m=0.02, yaw_rad=0.3), mass_scale=1.5,
                             friction=0.5), diffuse_scale=0.8)
    request = rollout_request(spec.to_dict(), "scripted-novice", [0, 1], run_id="determinism")
    a, b = fresh_prefix(tansu), fresh_prefix(tansu)
    ran_a = run_in_libero(libero_venv, tansu, a, request, [0, 1], tmp_path)
    ran_b = run_in_libero(libero_venv, tansu, b, request, [1], tmp_path)
    assert ran_a[1]["episode_id"] == ran_b[0]["episode_id"]
    episode = ran_b[0]["episode_id"]
    events = {p: [content(e) for e in consume(tansu, [f"{p}rollout.episodes", f"{p}rollout.steps"])
                  if e["episode_id"] == episode] for p in (a, b)}
    assert len(events[a]) == 2 + 40 and events[a] == events[b]

    started = next(e for e in events[a] if e["envelope"]["event_type"] == "EpisodeStarted")
    assert started["benchmark"] == "libero" and started["task"] == f"libero_object/{base.env_name}"
    assert started["scenario"]["perturbations"] == spec.perturbations
    # the signal contract: target first, contact groups, units as robosuite's
    steps = [e for e in events[a] if e["envelope"]["event_type"] == "Step"]
    names = [p["name"] for p in steps[0]["object_poses"]]
    assert names[0] == "alphabet_soup_1" and names[-1] == "milk_91" and "basket_1" in names
    groups = {g for s in steps for c in s["contacts"] for g in (c["a"], c["b"])}
    assert groups <= {"gripper", "robot", "table", *names} and "table" in groups
    for s in steps:
        assert len(s["joint_pos"]) == 7 and len(s["joint_torques"]) == 7 and len(s["action"]) == 7
        assert len(s["eef_pos"]) == 3 and len(s["eef_quat"]) == 4 and 0.0 <= s["gripper_opening"] < 0.09
        assert all(c["a"] < c["b"] and c["normal_force"] >= 0 for c in s["contacts"])
    assert steps[0]["object_lift"] == pytest.approx(0.0, abs=1e-3) and steps[0]["goal_distance"] > 0.2
    # the target rests on the floor after the settle steps (a friction edit applied before them once
    # threw it 20 cm up: the init states sink objects into the floor)
    assert steps[0]["object_poses"][0]["pos"][2] < 0.06


def _ended(events: list[dict], request_id: str, started: dict[str, dict]) -> dict[str, dict]:
    return {e["episode_id"]: e for e in events
            if e["envelope"]["event_type"] == "EpisodeEnded" and started.get(e["episode_id"], {}).get("request_id")
            == request_id}


def _stop_worker(pid: int) -> None:
    """SIGTERM to the worker's group, a second for it to go, then SIGKILL to what is left."""
    _kill_group(pid, signal.SIGTERM)
    time.sleep(1)
    _kill_group(pid)


def _kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


@pytest.mark.slow  # one of the default run's longest (README, Test)
def test_worker_serves_libero_requests_survives_a_kill_and_the_detector_reads_its_episodes(
        libero_venv, catalog, tansu, store, tmp_path):
    prefix = fresh_prefix(tansu)
    settings = load_settings(environ={}, memory_dir=tmp_path / "mem", bootstrap_servers=tansu, topic_prefix=prefix)
    publisher = Publisher(make_producer(tansu), prefix)
    # a robosuite request first: the LIBERO worker skips and commits it (no dead letter)
    robosuite = ScenarioSpec(env_name="Lift", horizon=20, instruction="lift the cube").to_dict()
    publisher.publish(rollout_request(robosuite, "oracle", [0], run_id="libero-e2e"))
    spec = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[SOUP], horizon=200)
    request = rollout_request(spec.to_dict(), "oracle", list(range(6)), run_id="libero-e2e")
    publisher.publish(request)
    publisher.flush()

    pid = start_libero_worker(settings, tansu, processes=2)
    assert pid is not None
    try:
        episodes_topic = f"{prefix}rollout.episodes"
        codec = Codec()
        consumer = Consumer({"bootstrap.servers": tansu, "group.id": f"watch-{uuid.uuid4().hex}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(episodes_topic, p, OFFSET_BEGINNING)
                         for p in consumer.list_topics(timeout=10).topics[episodes_topic].partitions])
        started: dict[str, dict] = {}
        ended_before_kill: set[str] = set()
        deadline = time.monotonic() + 300
        while not ended_before_kill and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.1):
                event = codec.decode(msg.value())
                if event["envelope"]["event_type"] == "EpisodeStarted":
                    started[event["episode_id"]] = event
                elif started.get(event["episode_id"], {}).get("request_id") == request["request_id"]:
                    ended_before_kill.add(event["episode_id"])
        consumer.close()
        _kill_group(pid)  # the worker and its pool processes, mid-request
        assert 0 < len(ended_before_kill) < 6, "the kill must land mid-request"
        pid = start_libero_worker(settings, tansu, processes=2)
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            events = consume(tansu, [episodes_topic], idle_s=1.0)
            started = {e["episode_id"]: e for e in events if e["envelope"]["event_type"] == "EpisodeStarted"}
            if len(_ended(events, request["request_id"], started)) == 6:
                break
            time.sleep(2)
    finally:
        _stop_worker(pid)

    events = consume(tansu, [f"{prefix}rollout.episodes", f"{prefix}rollout.steps", f"{prefix}deadletter"])
    started = {e["episode_id"]: e for e in events if e["envelope"]["event_type"] == "EpisodeStarted"}
    ended = _ended(events, request["request_id"], started)
    assert len(ended) == 6, f"{len(ended)} of 6 episodes ended"
    assert not [e for e in events if e["envelope"]["event_type"] == "DeadLetter"]
    assert all(e["benchmark"] == "libero" and e["scenario"]["benchmark"] == "libero" for e in started.values())
    assert sum(e["success"] for e in ended.values()) >= 5  # the oracle (each seed is another init state)
    keyframes = tmp_path / "mem" / "keyframes"  # keyframe_every 0: a timeout's final keyframe, a success's none
    assert all((e["final_keyframe_sha256"] is None) == (e["termination"] == "success") for e in ended.values())
    assert all((keyframes / e["final_keyframe_sha256"][:2] / f"{e['final_keyframe_sha256']}.png").exists()
               for e in ended.values() if e["final_keyframe_sha256"])

    # the evidence store counts each episode once, though the killed run's episodes were re-published
    drain(store, tansu, prefix, idle_exit_s=4)
    ids = sorted(ended)
    rows = store.query("SELECT envelope.event_type, count() FROM {database}.rollout_episodes FINAL "
                       "WHERE episode_id IN %(ids)s GROUP BY envelope.event_type", {"ids": tuple(ids)})
    assert dict(rows) == {"EpisodeStarted": 6, "EpisodeEnded": 6}
    steps = store.query("SELECT count() FROM {database}.rollout_steps FINAL WHERE episode_id IN %(ids)s",
                        {"ids": tuple(ids)})[0][0]
    assert steps == sum(e["steps"] for e in ended.values())
    assert store.query("SELECT count() FROM {database}.dead_letters FINAL")[0][0] == 0

    # the detector reads LIBERO episodes with its robosuite configuration
    by_episode: dict[str, list[dict]] = {i: [] for i in ids}
    for e in events:
        if e["envelope"]["event_type"] == "Step" and e["episode_id"] in by_episode:
            by_episode[e["episode_id"]].append(e)
    for episode_id in ids:
        detector = EpisodeDetector(DetectorConfig(), episode_id, spec.scenario_id, "oracle")
        moments = [m for s in sorted(by_episode[episode_id], key=lambda s: s["t"]) for m in detector.on_step(s)]
        moments += detector.on_end(ended[episode_id])
        kinds = {m["failure_type"] for m in moments}
        if ended[episode_id]["success"]:
            assert not kinds & {"grasp_miss", "slip", "drop", "timeout", "excessive_force"}, (episode_id, kinds)
        else:
            assert kinds, f"a failed episode without a failure moment: {episode_id}"


def _pool_processes(worker_pid: int) -> list[int]:
    """The worker's spawned pool processes (not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{worker_pid}/task/{worker_pid}/children").read_text().split()
    return [int(c) for c in children
            if "resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]


@pytest.mark.slow  # a LIBERO worker's start and four short oracle episodes: ~1.5 min on 2 cores
def test_a_pool_process_killed_mid_request_is_replaced_and_the_request_finishes(libero_venv, catalog, tansu,
                                                                                  store, tmp_path):
    """A pool process killed for memory (kill -9, as the kernel's OOM killer does) breaks the pool:
    the worker itself stays up, gets new processes, and every seed of the request ends once."""
    prefix = fresh_prefix(tansu)
    settings = load_settings(environ={}, memory_dir=tmp_path / "mem", bootstrap_servers=tansu, topic_prefix=prefix)
    spec = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[SOUP], horizon=120)
    request = rollout_request(spec.to_dict(), "oracle", list(range(4)), run_id="pool-kill")
    publisher = Publisher(make_producer(tansu), prefix)
    publisher.publish(request)
    publisher.flush()
    episodes_topic = f"{prefix}rollout.episodes"
    pid = start_libero_worker(settings, tansu, processes=2)
    try:
        deadline = time.monotonic() + 300
        while not any(e["envelope"]["event_type"] == "EpisodeStarted"
                      for e in consume(tansu, [episodes_topic], idle_s=0.5, timeout_s=5)):
            assert time.monotonic() < deadline, "no episode started"
        pool = _pool_processes(pid)
        assert len(pool) == 2, pool
        os.kill(pool[0], signal.SIGKILL)
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z", "the worker itself must not exit"
            events = consume(tansu, [episodes_topic], idle_s=1.0)
            started = {e["episode_id"]: e for e in events if e["envelope"]["event_type"] == "EpisodeStarted"}
            if len(_ended(events, request["request_id"], started)) == 4:
                break
            time.sleep(2)
        assert pool[0] not in _pool_processes(pid)
    finally:
        _stop_worker(pid)

    events = consume(tansu, [episodes_topic, f"{prefix}deadletter"])
    assert not [e for e in events if e["envelope"]["event_type"] == "DeadLetter"]
    started = {e["episode_id"]: e for e in events if e["envelope"]["event_type"] == "EpisodeStarted"}
    ended = _ended(events, request["request_id"], started)
    assert sorted(started[i]["seed"] for i in ended) == [0, 1, 2, 3]
    drain(store, tansu, prefix, idle_exit_s=4)
    assert store.query("SELECT count() FROM {database}.rollout_episodes FINAL WHERE envelope.event_type = "
                       "'EpisodeEnded'")[0][0] == 4


@pytest.mark.slow  # a LIBERO worker's start (~20 s) for one short episode
def test_the_libero_worker_records_the_requested_cameras_at_every_step(libero_venv, catalog, tansu, tmp_path):
    """Demonstrations with pixels on LIBERO: the worker renders the requested cameras before every
    action into the keyframe store, named by each Step's frames (#19), and refuses a camera the
    scene lacks with a dead letter naming the scene's cameras."""
    prefix = fresh_prefix(tansu)
    settings = load_settings(environ={}, memory_dir=tmp_path / "mem", bootstrap_servers=tansu, topic_prefix=prefix)
    publisher = Publisher(make_producer(tansu), prefix)
    spec = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[SOUP], horizon=6)
    cameras = ("agentview", "robot0_eye_in_hand")
    request = rollout_request(spec.to_dict(), "oracle", [0], run_id="libero-cameras", cameras=cameras, camera_size=32)
    wrong = rollout_request(spec.to_dict(), "oracle", [0], run_id="libero-cameras", cameras=("frontview_9",))
    publisher.publish(request)
    publisher.publish(wrong)
    publisher.flush()
    pid = start_libero_worker(settings, tansu, processes=1)
    assert pid is not None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            events = consume(tansu, [f"{prefix}rollout.episodes", f"{prefix}rollout.steps", f"{prefix}deadletter"],
                             idle_s=1.0)
            if any(e["envelope"]["event_type"] == "EpisodeEnded" for e in events) and \
                    any(e["envelope"]["event_type"] == "DeadLetter" for e in events):
                break
            time.sleep(2)
    finally:
        _stop_worker(pid)
    steps = sorted((e for e in events if e["envelope"]["event_type"] == "Step"), key=lambda e: e["t"])
    assert len(steps) == 6
    keyframes = tmp_path / "mem" / "keyframes"
    for step in steps:
        assert set(step["frames"]) == set(cameras), step["frames"]
        for sha in step["frames"].values():
            assert (keyframes / sha[:2] / f"{sha}.png").exists()
    first = steps[0]["frames"]
    assert first["agentview"] != first["robot0_eye_in_hand"]
    dead = [e for e in events if e["envelope"]["event_type"] == "DeadLetter"]
    assert len(dead) == 1 and "frontview_9" in dead[0]["reason"] and "agentview" in dead[0]["reason"], dead


class OpenpiServer:
    """An openpi-speaking policy server: metadata on connect, an action chunk per request; keeps
    what it was sent."""

    def __init__(self, chunk: int = 10):
        from openpi_client import msgpack_numpy
        from websockets.sync.server import serve

        self.msgpack, self.chunk = msgpack_numpy, chunk
        self.observations: list[dict] = []
        self.server = serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        host, port = self.server.socket.getsockname()[:2]
        self.uri = f"ws://{host}:{port}"

    def _handle(self, conn) -> None:
        conn.send(self.msgpack.packb({}))
        for message in conn:
            self.observations.append(self.msgpack.unpackb(message))
            actions = np.zeros((self.chunk, 7))
            actions[:, 2] = 0.2  # up, gripper open
            actions[:, 6] = -1.0
            conn.send(self.msgpack.packb({"actions": actions}))

    def __enter__(self) -> OpenpiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


def test_an_openpi_vla_gets_liberos_observation_layout(libero_venv, catalog, tansu, tmp_path):
    spec = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[SOUP], horizon=12)
    request = rollout_request(spec.to_dict(), "my-vla", [0], run_id="vla")
    prefix = fresh_prefix(tansu)
    with OpenpiServer() as server:
        ran = run_in_libero(libero_venv, tansu, prefix, request, [0], tmp_path, servers={"my-vla": server.uri})
    assert ran[0]["termination"] == "timeout" and ran[0]["steps"] == 12, ran
    assert len(server.observations) == 3  # openpi's example runs 5 actions of each chunk: 5 + 5 + 2
    obs = server.observations[0]
    assert set(obs) == {"observation/image", "observation/wrist_image", "observation/state", "prompt"}
    assert obs["prompt"] == "pick up the alphabet soup and place it in the basket"
    for key in ("observation/image", "observation/wrist_image"):
        assert obs[key].shape == (224, 224, 3) and obs[key].dtype == np.uint8 and obs[key].std() > 5
    assert obs["observation/state"].shape == (8,)
    # the state is eef position, axis-angle, the two finger positions; the hand rose between queries
    assert server.observations[1]["observation/state"][2] > obs["observation/state"][2] + 0.01
    events = consume(tansu, [f"{prefix}rollout.episodes"])
    started = next(e for e in events if e["envelope"]["event_type"] == "EpisodeStarted")
    assert started["model_id"] == "my-vla" and started["model_version"] == "server"


def test_a_registered_pixel_policy_gets_its_own_layout_and_cameras_on_libero(libero_venv, catalog, tansu, tmp_path):
    """A websocket model of the registry (a policy trained on our export: producers/learned/) runs on
    LIBERO as on robosuite (#19): its cameras rendered before every action at its size, its state
    from the Step's signals in its layout's order, the instruction as its prompt."""
    spec = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[SOUP], horizon=12)
    state = ["joint_pos", "eef_pos", "eef_quat", "gripper_opening"]
    prefix = fresh_prefix(tansu)
    with OpenpiServer() as server:
        models = tmp_path / "models.yaml"
        models.write_text(json.dumps({"models": [
            {"model_id": "oracle", "version": "1", "kind": "oracle", "rank": 0,
             "skill": {"target_noise_m": 0.0, "action_noise": 0.0, "timing_jitter": 0.0, "precision": 1.0}},
            {"model_id": "pixel-vla", "version": "3", "kind": "websocket", "uri": server.uri, "action_dim": 7,
             "cameras": ["agentview", "robot0_eye_in_hand"], "camera_size": 32,
             "observation": {"observation/images/agentview": "agentview_image",
                             "observation/images/wrist": "robot0_eye_in_hand_image",
                             "observation/state": state}}]}))  # JSON is YAML
        request = rollout_request(spec.to_dict(), "pixel-vla", [0], run_id="pixel")
        ran = run_in_libero(libero_venv, tansu, prefix, request, [0], tmp_path, models=models)
    assert ran[0]["termination"] == "timeout" and ran[0]["steps"] == 12, ran
    assert len(server.observations) == 2  # chunks of 10: 10 + 2
    obs = server.observations[0]
    assert set(obs) == {"observation/images/agentview", "observation/images/wrist", "observation/state", "prompt"}
    assert obs["prompt"] == "pick up the alphabet soup and place it in the basket"
    agent, wrist = obs["observation/images/agentview"], obs["observation/images/wrist"]
    for image in (agent, wrist):
        assert image.shape == (32, 32, 3) and image.dtype == np.uint8 and image.std() > 5
    assert not np.array_equal(agent, wrist)
    assert obs["observation/state"].shape == (7 + 3 + 4 + 1,)
    z = 7 + 2  # eef_pos's z, after the 7 joint positions: the hand rose between the two requests
    assert server.observations[1]["observation/state"][z] > obs["observation/state"][z] + 0.01
    started = next(e for e in consume(tansu, [f"{prefix}rollout.episodes"])
                   if e["envelope"]["event_type"] == "EpisodeStarted")
    assert started["model_id"] == "pixel-vla" and started["model_version"] == "3"


def test_the_venvs_python_runs_the_libero_bench_by_hand(libero_venv, tmp_path):
    # README: `<libero venv>/bin/python -m producers.libero.bench`, with nothing else set: the env
    # finds the venv's own config instead of refusing for want of LIBERO_CONFIG_PATH.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIBERO_", "SEPA_", "MUJOCO_", "PYOPENGL"))}
    env["PYTHONPATH"] = str(ROOT)
    out = tmp_path / "bench.json"
    proc = subprocess.run([str(libero_venv.python), "-m", "producers.libero.bench", "--tasks", "4", "--seeds", "1",
                           "--models", "oracle", "--axes", "base", "--json", str(out)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert (row.get("error"), row["model"], row["axis"], row["episodes"]) == (None, "oracle", "base", 1), row
