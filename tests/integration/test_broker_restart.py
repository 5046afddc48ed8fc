"""The embedded broker keeps its topics in memory, so `down` and `up` start from empty topics while
the evidence log still holds a request no worker served and episodes the detector never analysed.
`up` re-publishes exactly those from the log (nothing already served runs again), and the loop's
waits are answered: the request's episodes end, every ended episode gets its EpisodeAnalysed.
`replay --republish --verify` with the stack up goes through a private broker: identical, and
nothing republished reaches the running stack."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from stack_helpers import processes_holding, sepa

from infra.kafka_clients import make_producer
from producers.adapters import RobosuiteAdapter
from producers.publisher import Publisher
from producers.rollout_worker import sweep_request
from schemas.codec import Codec

LANDING_S = 240.0


def _evidence(memory_dir) -> dict:
    return json.loads(sepa(memory_dir, "status", "--json").stdout)["evidence"]


def _wait_for(memory_dir, wanted: dict[str, int]) -> dict:
    deadline = time.monotonic() + LANDING_S
    while True:
        evidence = _evidence(memory_dir)
        if all(evidence.get(table) == n for table, n in wanted.items()) or time.monotonic() > deadline:
            return evidence
        time.sleep(2)


def _settled(memory_dir, table: str) -> dict:
    """The evidence counts once ``table``'s count is above 0 and has not moved for 8 s."""
    deadline = time.monotonic() + LANDING_S
    seen, since = -1, time.monotonic()
    while True:
        evidence = _evidence(memory_dir)
        if evidence.get(table, 0) != seen:
            seen, since = evidence.get(table, 0), time.monotonic()
        elif seen > 0 and time.monotonic() - since >= 8 or time.monotonic() > deadline:
            return evidence
        time.sleep(2)


def _publish(memory_dir, model: str, seeds: list[int]) -> dict:
    state = json.loads((memory_dir / "run" / "state.json").read_text())
    scenario = RobosuiteAdapter().base_scenario("Lift", 30)
    request = sweep_request(scenario, model, "1", seeds)
    publisher = Publisher(make_producer(state["bootstrap"]), "sepa.", Codec())
    publisher.publish(request)
    publisher.flush()
    return request


@pytest.mark.slow  # three `up`s, two `down`s and four simulated episodes: ~6 min
def test_up_with_a_new_embedded_broker_republishes_what_the_log_holds_in_flight(tmp_path):
    memory_dir = tmp_path / "m"
    try:
        assert sepa(memory_dir, "up").returncode == 0
        status = json.loads(sepa(memory_dir, "status", "--json").stdout)
        os.kill(status["streams"]["pid"], signal.SIGKILL)  # nothing analyses the next episodes
        _publish(memory_dir, "scripted-novice", [0, 1])
        landed = _wait_for(memory_dir, {"rollout_episodes": 4})
        assert landed["rollout_episodes"] == 4 and landed["failure_episodes"] == 0, landed
        os.kill(status["rollout_worker"]["pid"], signal.SIGKILL)  # nothing serves the next request
        unserved = _publish(memory_dir, "oracle", [0])
        assert _wait_for(memory_dir, {"rollout_requests": 2})["rollout_requests"] == 2
        assert sepa(memory_dir, "down").returncode == 0

        again = sepa(memory_dir, "up")
        assert again.returncode == 0, again.stdout + again.stderr
        said = re.search(r"got what the evidence log holds in flight: (.*)$", again.stdout, re.MULTILINE)
        assert said, again.stdout
        counts = dict((topic, int(n)) for n, topic in re.findall(r"(\d+) on ([\w.]+)", said.group(1)))
        assert counts["rollout.requests"] == 1, counts  # the served request is not run again
        assert counts["rollout.episodes"] == 4 and counts["rollout.steps"] > 0, counts

        after = _wait_for(memory_dir, {"rollout_episodes": 6, "failure_episodes": 3})
        assert after["rollout_episodes"] == 6 and after["failure_episodes"] == 3, after
        assert after["rollout_requests"] == 2, "the re-published request is the stored one, counted once"
        served = re.findall(r"request (req-\w+): \d+ episodes", (memory_dir / "run" / "rollout.log").read_text())
        assert served.count(unserved["request_id"]) == 1, served

        # the whole log through a private broker, with the stack up: the stack sees none of it
        replayed = sepa(memory_dir, "replay", "--republish", "--verify")
        assert replayed.returncode == 0 and "identical" in replayed.stdout, replayed.stdout + replayed.stderr
        assert "private embedded broker" in replayed.stdout
        time.sleep(5)
        now = _evidence(memory_dir)  # (the clusterer may still be adding to its own tables)
        assert [now[t] for t in ("rollout_requests", "rollout_episodes", "failure_episodes")] == \
            [after[t] for t in ("rollout_requests", "rollout_episodes", "failure_episodes")], \
            "nothing republished reached the running stack"
        assert re.findall(r"request (req-\w+): \d+ episodes", (memory_dir / "run" / "rollout.log").read_text()) \
            == served

        # the clusterer's history comes back with a new broker: it restores from it and goes on
        # numbering its output where the log ends (a blank one would reuse the stored ids)
        clustered = _settled(memory_dir, "failure_clusters")
        assert clustered["failure_clusters"] > 0, clustered
        assert sepa(memory_dir, "down").returncode == 0
        third = sepa(memory_dir, "up")
        assert third.returncode == 0, third.stdout + third.stderr
        assert f"{clustered['failure_clusters']} on failures.clusters" in third.stdout, third.stdout
        assert "3 on failures.episodes" in third.stdout, third.stdout
        _publish(memory_dir, "scripted-clumsy", [5])
        _wait_for(memory_dir, {"failure_episodes": 4})
        grown = _settled(memory_dir, "failure_clusters")
        assert grown["failure_episodes"] == 4 and grown["failure_clusters"] > clustered["failure_clusters"], grown
        assert grown.get("dead_letters", 0) == clustered.get("dead_letters", 0), grown
    finally:
        sepa(memory_dir, "down")
    assert processes_holding(memory_dir) == []
