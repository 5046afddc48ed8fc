"""The run orchestrator's waits against the evidence log, fed with events this test publishes (the
detector's EpisodeAnalysed and the clusterer's intake ClusterAssigned are written by hand here):
a real broker, the real sink, a real chDB store."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from evidence_factory import EvidenceLog, spec, store_events
from sinks import make_sink

from consumers import state as q
from infra.exceptions import RequestRefused, WaitTimeout
from infra.kafka_clients import ensure_topics, make_producer
from infra.orchestrator import EvolveConfig, check_models, cycle_started, request_rollouts
from infra.waits import Settled, deadline_in, wait_for_episodes, wait_until_settled
from producers.publisher import Publisher
from producers.rollout_worker import rollout_request
from producers.sim.models import load_models
from schemas.codec import Codec
from schemas.events import dead_letter, make_event
from schemas.scenario import ScenarioSpec

QUALITY = {"smoothness_jerk": 0.0, "path_efficiency": 1.0, "peak_contact_force": 0.0, "mean_contact_force": 0.0,
           "time_to_success": None, "regrasp_count": 0, "idle_steps": 0}
SCENARIO = ScenarioSpec(env_name="Lift", horizon=10, instruction="lift the cube").to_dict()
LANDING_S = 60.0


def started(request: dict, seed: int) -> dict:
    episode_id = f"ep-{request['request_id']}-{seed}"
    return make_event("EpisodeStarted", (episode_id,), "test", "test", episode_id=episode_id,
                      request_id=request["request_id"], benchmark="robosuite", task="Lift",
                      scenario_id=SCENARIO["scenario_id"], scenario=SCENARIO, instruction="lift the cube",
                      model_id=request["model_id"], model_version="1", seed=seed, variant="", simulator="")


def ended(episode: dict, termination: str) -> dict:
    return make_event("EpisodeEnded", (episode["episode_id"],), "test", "test", episode_id=episode["episode_id"],
                      scenario_id=SCENARIO["scenario_id"], model_id=episode["model_id"],
                      success=termination == "success", termination=termination, steps=10, total_reward=0.0,
                      quality=QUALITY, error=None, final_keyframe_sha256=None)


def analysed(episode: dict, termination: str, ok: bool = True, moments: int = 1) -> dict:
    outcome = {"moment_id": "m", "failure_type": "stall", "step": 3, "severity": 1.0, "features": {},
               "recovered_step": -1, "recovery": ""}
    return make_event("EpisodeAnalysed", (episode["episode_id"],), "detector", "test",
                      episode_id=episode["episode_id"], scenario_id=SCENARIO["scenario_id"],
                      model_id=episode["model_id"], scenario=SCENARIO, success=termination == "success",
                      termination=termination, steps=10, quality=QUALITY, analysed=ok,
                      reason="" if ok else "too many steps before EpisodeStarted",
                      moments=[outcome] * moments if ok else [], detector_version="test")


def assigned(episode: dict, position: int, intake: bool) -> dict:
    return make_event("ClusterAssigned", ("assign", episode["episode_id"], position), "clusterer", "test",
                      cluster_id="noise", episode_id=episode["episode_id"], scenario_id=SCENARIO["scenario_id"],
                      distance=0.0, embedding=[0.0, 1.0], clusterer_version="test", model_id=episode["model_id"],
                      intake=intake, revision=0, position=position)


class LiveSink:
    """The evidence sink in a thread, and a wait until the store holds what was published."""

    def __init__(self, store, broker: str, prefix: str):
        self.store = store
        self.stop = threading.Event()
        self.sink = make_sink(store, broker, prefix)
        self.thread = threading.Thread(target=self.sink.run, args=(self.stop,), daemon=True)

    def landed(self, table: str, count: int) -> None:
        deadline = time.monotonic() + LANDING_S
        while self.store.query(f"SELECT count() FROM {{database}}.{table} FINAL")[0][0] < count:
            assert time.monotonic() < deadline and self.thread.is_alive(), f"{table} never reached {count}"
            time.sleep(0.2)


@pytest.fixture
def live(tansu, store):
    prefix = f"o{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    sink = LiveSink(store, tansu, prefix)
    sink.thread.start()
    yield sink, Publisher(make_producer(tansu), prefix)
    sink.stop.set()
    sink.thread.join(timeout=30)


def publish(publisher: Publisher, *events: dict) -> None:
    for event in events:
        publisher.publish(event)
    publisher.flush()


def test_the_waits_name_what_is_missing_until_every_episode_is_analysed_and_every_failure_taken_in(live, store):
    sink, publisher = live
    first = rollout_request(SCENARIO, "scripted-novice", [0, 1, 2], run_id="t")
    second = rollout_request(SCENARIO, "scripted-clumsy", [0], run_id="t")
    success, timeout, env_error = (started(first, s) for s in (0, 1, 2))
    unanalysable = started(second, 0)
    publish(publisher, success, timeout, env_error, unanalysable,
            ended(success, "success"), ended(timeout, "timeout"), ended(env_error, "env_error"))
    sink.landed("rollout_episodes", 7)

    with pytest.raises(WaitTimeout, match=rf"1 of 4 requested episodes have not ended.*{second['request_id']}: 0 of 1"):
        wait_for_episodes(store, [first, second], deadline_in(0.5))
    publish(publisher, ended(unanalysable, "timeout"))
    seen = []
    assert wait_for_episodes(store, [first, second], deadline_in(LANDING_S), progress=lambda d, t: seen.append(d)) == 4
    assert seen[-1] == 4

    with pytest.raises(WaitTimeout, match="4 of 4 ended episodes have no EpisodeAnalysed in failure_episodes"):
        wait_until_settled(store, [first, second], deadline_in(0.5))
    publish(publisher, analysed(success, "success", moments=2), analysed(timeout, "timeout"),
            analysed(env_error, "env_error"), analysed(unanalysable, "timeout", ok=False))
    sink.landed("failure_episodes", 4)
    # only the timeout is a failure the clusterer takes in: the env_error is not the policy's, the
    # unanalysed episode has no moments to cluster
    with pytest.raises(WaitTimeout, match=rf"1 of 1 failed \(or fragile\) episodes have no intake ClusterAssigned.*"
                                          rf"{timeout['episode_id']}$"):
        wait_until_settled(store, [first, second], deadline_in(0.5))
    publish(publisher, assigned(timeout, 7, intake=False))  # a re-assignment is not the intake
    sink.landed("failure_clusters", 1)
    with pytest.raises(WaitTimeout, match="no intake ClusterAssigned"):
        wait_until_settled(store, [first, second], deadline_in(0.5))
    publish(publisher, assigned(timeout, 3, intake=True))
    settled = wait_until_settled(store, [first, second], deadline_in(LANDING_S))
    assert settled == Settled(episodes=4, failed=1, fragile=0, analysed=4, moments=4, clustered=1)

    # asking again for requests whose episodes all ended publishes nothing; a new one is published
    before = publisher.published
    again = request_rollouts(publisher, store, SCENARIO, ["scripted-novice"], [0, 1, 2], run_id="t")
    assert [r["request_id"] for r in again] == [first["request_id"]] and publisher.published == before
    [longer] = request_rollouts(publisher, store, SCENARIO, ["scripted-novice"], [0, 1, 2, 3], run_id="t")
    assert publisher.published == before + 1

    # a request the rollout worker dead-lettered is named with the worker's reason
    topic = publisher.prefix + "rollout.requests"
    publish(publisher, dead_letter("worker", "worker", topic, 0, 5, b"k", Codec().encode(longer),
                                   "KeyError: model 'x' is not registered"))
    sink.landed("dead_letters", 1)
    assert q.refused_requests(store, topic, [first["request_id"], longer["request_id"]]) == {
        longer["request_id"]: "KeyError: model 'x' is not registered"}
    # a wait for its episodes ends at once with that reason, not at its deadline
    with pytest.raises(RequestRefused, match=r"refused req-\w+: KeyError: model 'x' is not registered"):
        wait_for_episodes(store, [longer], deadline_in(600), requests_topic=topic)
    # published again later (the model since registered), it is not refused by the earlier refusal
    again = {**longer, "envelope": {**longer["envelope"], "event_time": datetime.now(UTC) + timedelta(seconds=1)}}
    assert q.refused_requests(store, topic, [longer["request_id"]], since=again["envelope"]["event_time"]) == {}
    with pytest.raises(WaitTimeout):
        wait_for_episodes(store, [again], deadline_in(0), requests_topic=topic)


def test_an_unknown_model_is_refused_before_anything_is_published():
    models = load_models()
    check_models(["oracle"], models)
    with pytest.raises(ValueError, match=r"'nope' is not in the model registry; known: \['oracle'"):
        check_models(["oracle", "nope"], models)


def test_a_rerun_goes_on_from_the_position_its_cycle_started_at_not_a_new_one(store):
    config, models = EvolveConfig(run_id="run-0"), load_models()
    log = EvidenceLog(run_id="run-0")
    scenario = spec("base")
    log.cluster_updated("c1", 3, "ep-1", "missed_grasp", scenario)
    first = cycle_started(store, config, 1, 1, models)
    assert first is not None and first["clusters_position"] == 0  # nothing stored yet
    store_events(store, [*log.events, first])
    for i in range(5):  # the clusterer went on while the run was down
        log.cluster_updated(f"c{i + 2}", 3, "ep-1", "missed_grasp", scenario)
    store_events(store, log.events[1:])
    assert q.cluster_log_length(store) == 6

    assert cycle_started(store, config, 1, 1, models) is None, "cycle 1 started already: nothing to publish"
    [stored] = [c for c in q.cycles(store) if c.cycle_id == "run-0-c1"]
    assert stored.clusters_position == 0
    assert cycle_started(store, config, 2, 1, models)["clusters_position"] == 6
