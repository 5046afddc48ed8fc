"""What must hold when the detector scales out the Kafka way (more partitions, more workers): two
streams workers in one consumer group share rollout.steps / rollout.episodes (4 partitions each,
co-partitioned by faust's assignor, so partition p of both topics goes to one worker); a second
worker joins mid-stream and the first is then killed with SIGKILL mid-stream; together they lose
and duplicate no failure moment and no EpisodeAnalysed. Apache Kafka, real
``faust ... worker --without-web`` processes configured through SEPA_* like any deployment (without
the web server: two workers on one host would otherwise both bind 0.0.0.0:6066).

Twenty-four synthetic rollout workers publish interleaved episodes at a steady rate for ~30 s, so
about two dozen episodes are always open and each spans several of faust's commits:
- worker A starts alone and takes all four partitions;
- once a sixth of the input is committed, worker B starts: the group rebalances, A keeps two
  partitions (its stage forgets its open episodes and faust seeks back to the committed offsets),
  B resumes the other two from A's commits;
- once the group is stable with two members each holding two rollout.steps partitions and every
  partition's commit has moved on since, A is killed (-9: no final commit, no flush); after the
  session timeout B takes A's partitions and resumes them from A's last commits.
Expected: what the pure detector makes of each episode fed in order (EpisodeDetector for the
moments, DetectorStage for the EpisodeAnalysed). Every expected id must arrive, every copy of an id
must be byte-identical to the expected one (re-emissions after the rebalances are allowed, they
are the same fact), nothing else may arrive, and no worker may have skipped or cut short an
episode (its stage counters).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, TopicPartition
from confluent_kafka.admin import AdminClient
from steady_publisher import publish_steadily

from infra.kafka_clients import ensure_topics
from producers import synthetic
from schemas.catalog import BY_NAME, topic_for
from schemas.codec import Codec
from streams.deadletter import RawMessage
from streams.failures.detector import DetectorConfig, EpisodeDetector
from streams.failures.router import DetectorStage, RouterConfig

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
# The faust edge a deployment runs; infra/ is moving it from streams.app to infra/streams_worker.py.
EDGE = "infra.streams_worker" if (ROOT / "infra" / "streams_worker.py").exists() else "streams.app"
STREAMS_WORKER = [sys.executable, "-m", "faust", "-A", EDGE, "worker", "--without-web", "-l", "info"]
GROUP = "sepa-streams"  # StreamsConfig.app_id: the faust app id is the consumer group
ROLLOUT_WORKERS = 24
EPISODES_EACH = 8
EVENTS_PER_S = 1200
# Stage counters that would mean an episode in flight was skipped or cut short (tails of episodes
# decided before a rebalance are "replayed_tail" and allowed), as in test_streams_restart.py.
SKIPPED = ("joined_late", "not_analysed", "ended_with_missing_steps", "evicted", "idle_dropped", "held_dropped",
           "buffer_overflow")


def interleaved_episodes(seed: int) -> list[dict]:
    """Events of ROLLOUT_WORKERS concurrent rollout workers (different episode lengths), round robin."""
    return synthetic.interleaved(*(synthetic.episodes(EPISODES_EACH, 60 + 10 * w, seed=seed + w, run_id=f"scale-{w}")
                                   for w in range(ROLLOUT_WORKERS)))


def pure_outputs(events: list[dict], codec: Codec) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(moments, analysed): event_id -> encoded FailureMoment, and -> encoded EpisodeAnalysed. The
    moments from EpisodeDetector fed each episode in order, as decoded from the wire; the
    EpisodeAnalysed from a DetectorStage fed each episode's messages in order (it makes the same
    moments, checked here)."""
    by_episode: dict[str, list[dict]] = defaultdict(list)
    for event in events:
        by_episode[event["episode_id"]].append(event)
    moments: dict[str, bytes] = {}
    stage = DetectorStage(DetectorConfig(), RouterConfig(), "pure.", "pure", codec=codec)
    staged: dict[str, dict[str, bytes]] = {"failures.moments": {}, "failures.episodes": {}}
    offset = 0
    for episode_id, episode in by_episode.items():
        start, *steps, end = (codec.decode(codec.encode(e)) for e in episode)
        detector = EpisodeDetector(DetectorConfig(), episode_id, start["scenario_id"], start["model_id"])
        for step in steps:
            detector.on_step(step)
        detector.on_end(end)
        moments.update((m["envelope"]["event_id"], codec.encode(m)) for m in detector.moments)
        raws = []
        for event in episode:
            raws.append(RawMessage(topic_for(event["envelope"]["event_type"]).full_name("pure."), 0, offset,
                                   episode_id.encode(), codec.encode(event)))
            offset += 1
        for out in stage.process(raws):
            staged[out.topic][codec.decode(out.value)["envelope"]["event_id"]] = out.value
    assert staged["failures.moments"] == moments, "DetectorStage and EpisodeDetector disagree on the moments"
    assert len(staged["failures.episodes"]) == len(by_episode)
    return moments, staged["failures.episodes"]


class OutputReader:
    """Every message of the given topics from the beginning: topic -> event_id -> [value, ...]."""

    def __init__(self, broker: str, topics: list[str], codec: Codec):
        self.codec = codec
        self.copies: dict[str, dict[str, list[bytes]]] = {topic: defaultdict(list) for topic in topics}
        self.consumer = Consumer({"bootstrap.servers": broker, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False})
        metadata = self.consumer.list_topics(timeout=10).topics
        self.consumer.assign([TopicPartition(topic, p, 0) for topic in topics for p in metadata[topic].partitions])

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for msg in self.consumer.consume(1000, timeout=0.2):
                if msg.error() is None:
                    event_id = self.codec.decode(msg.value())["envelope"]["event_id"]
                    self.copies[msg.topic()][event_id].append(msg.value())

    def close(self) -> None:
        self.consumer.close()


def start_worker(broker: str, prefix: str, memory_dir: Path, log_path: Path) -> subprocess.Popen:
    """A streams worker as a deployment starts it; each has its own memory dir (faust's data dir)."""
    env = {**os.environ, "SEPA_BOOTSTRAP_SERVERS": broker, "SEPA_TOPIC_PREFIX": prefix,
           "SEPA_MEMORY_DIR": str(memory_dir)}
    with open(log_path, "ab") as log:
        return subprocess.Popen(STREAMS_WORKER, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def wait_for_line(log_path: Path, text: str, worker: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log_path.read_text(errors="replace"):
        assert worker.poll() is None, f"the worker exited with {worker.returncode}; see {log_path}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s; see {log_path}"
        time.sleep(0.2)


def input_partitions(broker: str, prefix: str) -> list[TopicPartition]:
    probe = Consumer({"bootstrap.servers": broker, "group.id": GROUP})
    try:
        metadata = probe.list_topics(timeout=10).topics
        return [TopicPartition(prefix + name, p) for name in ("rollout.steps", "rollout.episodes")
                for p in sorted(metadata[prefix + name].partitions)]
    finally:
        probe.close()


def committed(broker: str, partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
    """The group's committed offset per input partition (0 where none yet)."""
    probe = Consumer({"bootstrap.servers": broker, "group.id": GROUP, "enable.auto.commit": False})
    try:
        return {(tp.topic, tp.partition): max(tp.offset, 0) for tp in probe.committed(partitions, timeout=10)}
    finally:
        probe.close()


def steps_assignment(admin: AdminClient, prefix: str) -> list[tuple[int, ...]] | None:
    """The rollout.steps partitions of each member of the group, sorted, once the group is stable
    (None while it rebalances)."""
    description = admin.describe_consumer_groups([GROUP], request_timeout=10)[GROUP].result()
    if description.state != ConsumerGroupState.STABLE:
        return None
    topic = prefix + "rollout.steps"
    return sorted(tuple(sorted(tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic))
                  for m in description.members)


def wait_until(condition, what: str, timeout: float, workers: dict[str, subprocess.Popen], poll) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for name, worker in workers.items():
            assert worker.poll() is None, f"worker {name} exited with {worker.returncode}"
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        poll(0.5)


def detector_stats(log_path: Path) -> list[dict[str, int]]:
    """Every set of detector counters the worker logged (periodically and at a clean stop), in order."""
    return [{k: int(v) for k, v in (item.split("=") for item in line.split(", "))}
            for line in re.findall(r"failure-detector: (.*)", log_path.read_text(errors="replace"))]


def differences(codec: Codec, want: dict[str, bytes], changed: dict[str, list[bytes]], show: int = 3) -> list:
    """For a few changed ids: (event id, episode id, the fields whose values differ and the envelope
    fields that do, as (expected, got))."""
    out = []
    for event_id, copies in list(changed.items())[:show]:
        expected, got = codec.decode(want[event_id]), codec.decode(copies[0])
        fields = {k: (expected.get(k), got.get(k)) for k in expected.keys() | got.keys()
                  if k != "envelope" and expected.get(k) != got.get(k)}
        envelope = {k: (v, got["envelope"].get(k)) for k, v in expected["envelope"].items()
                    if got["envelope"].get(k) != v}
        out.append((event_id, got.get("episode_id"), fields, envelope))
    return out


@pytest.mark.slow  # one of the default run's longest (README, Test)
def test_two_workers_joining_and_killed_mid_stream_lose_and_duplicate_no_failure_moment(apache_kafka, tmp_path):
    broker, prefix, codec = apache_kafka, f"s{uuid.uuid4().hex[:10]}.", Codec()
    ensure_topics(broker, prefix)
    assert BY_NAME["rollout.steps"].partitions == BY_NAME["rollout.episodes"].partitions == 4
    events = interleaved_episodes(seed=70)
    expected, expected_analysed = pure_outputs(events, codec)
    assert len(expected) > 200

    moments_topic, episodes_topic = prefix + "failures.moments", prefix + "failures.episodes"
    reader = OutputReader(broker, [moments_topic, episodes_topic], codec)
    admin = AdminClient({"bootstrap.servers": broker})
    logs = {"A": tmp_path / "worker-a.log", "B": tmp_path / "worker-b.log"}
    published, joined, killed = threading.Event(), threading.Event(), threading.Event()
    # the middle third flows once B has joined, the last once A is dead: both land mid-stream
    gates = [(len(events) // 3, joined), (2 * len(events) // 3, killed)]
    publisher = threading.Thread(target=publish_steadily, args=(broker, prefix, events, published, EVENTS_PER_S),
                                 kwargs={"gates": gates}, daemon=True)
    workers = {"A": start_worker(broker, prefix, tmp_path / "mem-a", logs["A"])}
    timings: dict[str, float] = {}
    try:
        wait_for_line(logs["A"], "Worker ready", workers["A"], timeout=90)
        partitions = input_partitions(broker, prefix)
        publisher.start()
        t0 = time.monotonic()
        wait_until(lambda: sum(committed(broker, partitions).values()) >= len(events) // 6,
                   "worker A committed a sixth of the input", 120, workers, reader.poll)

        workers["B"] = start_worker(broker, prefix, tmp_path / "mem-b", logs["B"])  # joins mid-stream
        timings["B started"] = time.monotonic() - t0
        wait_for_line(logs["B"], "Worker ready", workers["B"], timeout=90)
        wait_until(lambda: [len(p) for p in steps_assignment(admin, prefix) or []] == [2, 2],
                   "a stable group of two workers holding two rollout.steps partitions each", 60, workers,
                   reader.poll)
        at_join = committed(broker, partitions)
        joined.set()
        wait_until(lambda: all(n > at_join[tp] for tp, n in committed(broker, partitions).items()
                               if tp[0] == prefix + "rollout.steps"),
                   "every rollout.steps partition committed progress with both workers in the group", 60, workers,
                   reader.poll)

        workers["A"].kill()  # SIGKILL: no final commit, no flush, no leave-group
        workers["A"].wait()
        timings["A killed"] = time.monotonic() - t0
        publishing_at_kill = not published.is_set()
        reader.poll(0.5)
        seen_at_kill = len(reader.copies[moments_topic])
        killed.set()
        assert 0 < seen_at_kill < len(expected), "the kill must land mid-stream"

        survivor = {"B": workers["B"]}
        wait_until(lambda: steps_assignment(admin, prefix) == [(0, 1, 2, 3)],
                   "worker B holding every rollout.steps partition after A's death", 60, survivor, reader.poll)
        assert published.wait(90), "the publisher did not finish"
        deadline, quiet_since, seen = time.monotonic() + 120, time.monotonic(), -1
        while not (set(expected) <= set(reader.copies[moments_topic])
                   and set(expected_analysed) <= set(reader.copies[episodes_topic])):
            reader.poll(1.0)
            now_seen = len(reader.copies[moments_topic]) + len(reader.copies[episodes_topic])
            if now_seen > seen:
                quiet_since, seen = time.monotonic(), now_seen
            assert workers["B"].poll() is None, f"worker B exited with {workers['B'].returncode}; see {logs['B']}"
            if time.monotonic() > deadline or time.monotonic() - quiet_since > 30:
                break  # the assertions below say what is missing
        reader.poll(5.0)  # anything emitted late, twice, or never expected
        timings["drained"] = time.monotonic() - t0
        workers["B"].send_signal(signal.SIGTERM)
        workers["B"].wait(60)
    finally:
        joined.set()
        killed.set()
        for worker in workers.values():
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        reader.close()
        publisher.join(90)

    for topic, want in ((moments_topic, expected), (episodes_topic, expected_analysed)):
        got = reader.copies[topic]
        missing, unexpected = set(want) - set(got), set(got) - set(want)
        assert (len(missing), len(unexpected)) == (0, 0), f"{topic}: see {logs}"
        changed = {event_id: [copy for copy in copies if copy != want[event_id]] for event_id, copies in got.items()}
        changed = {event_id: copies for event_id, copies in changed.items() if copies}
        assert changed == {}, (f"{topic}: {len(changed)} events differ from the pure detector's, e.g. "
                               f"{differences(codec, want, changed)}; see {logs}")

    stats = {name: detector_stats(path) for name, path in logs.items()}
    assert stats["B"], f"worker B logged no detector counters; see {logs['B']}"
    skipped = {name: [{k: s[k] for k in SKIPPED if s.get(k)} for s in lines] for name, lines in stats.items()}
    assert all(counts == {} for lines in skipped.values() for counts in lines), skipped
    assert stats["B"][-1]["messages"] < len(events), "worker B read everything: it resumed from no commit"
    duplicates = {topic: sum(len(c) - 1 for c in copies.values()) for topic, copies in reader.copies.items()}
    print(f"{len(expected)} moments and {len(expected_analysed)} EpisodeAnalysed from {len(events)} events; "
          f"{seen_at_kill} moments out at the kill ({'while' if publishing_at_kill else 'after'} publishing); "
          f"re-emitted copies {duplicates}; timings {timings}; worker B's last counters {stats['B'][-1]}")
