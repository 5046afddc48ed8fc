"""What a farm relies on when rollout workers scale out and crash: two `sepa-eval rollout-worker`
processes in one consumer group on Apache Kafka share rollout.requests; one of them is killed with
SIGKILL in the middle of a request and started again.

The unit of resume is the request: its offset is committed only after all its episodes were
published, so the request in flight at the kill runs again from its first seed, with the same
event and episode ids (the evidence sink stores each id once), and no request committed before the
kill runs again. Every other request runs exactly once, on one of the two workers.

The rebalances (B joining, A's death, A's return) refuse commits of the worker that keeps its
partitions (ILLEGAL_GENERATION): producers/commits.Committer commits them again, else the group's
lag on a partition with no later request would never reach zero and "every request committed"
below would wait for ever (it did, one run in three, before the retry).
"""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

REQUESTS, SEEDS = 16, 3


def test_two_workers_share_the_requests_and_a_killed_one_reruns_only_its_request_in_flight(apache_kafka, tmp_path):
    from bench import scale_out as so
    from infra.kafka_clients import ensure_topics

    bootstrap, prefix = apache_kafka, "scaleout-test."
    ensure_topics(bootstrap, prefix)
    log = so.EpisodeLog(bootstrap, prefix)
    a = so.start_worker(tmp_path / "a", bootstrap, prefix)
    workers = {"a": a}
    try:
        # A alone first, so its member id is known when B joins.
        [member_a] = so.wait_for(lambda: so.settled(bootstrap, prefix, 1), "A alone in the group", 120, [a])
        workers["b"] = so.start_worker(tmp_path / "b", bootstrap, prefix)
        assignment = so.wait_for(lambda: so.settled(bootstrap, prefix, 2), "a stable group of A and B", 120,
                                 list(workers.values()))
        parts_a = set(assignment[member_a])
        assert 0 < len(parts_a) < 12

        placed = so.publish_requests(bootstrap, prefix, so.requests_for(
            [[SEEDS * i + s for s in range(SEEDS)] for i in range(REQUESTS)]))
        on_a = [p for p in placed if p.partition in parts_a]
        assert len(on_a) >= 4, f"the key hash put only {len(on_a)} of {REQUESTS} requests on A's partitions"

        def a_in_flight() -> list[so.Placed]:
            """A's requests it has started (an EpisodeStarted read back) and not committed."""
            offsets, (started, _) = so.committed(bootstrap, prefix), log.snapshot()
            return [p for p in on_a if p.offset >= offsets[p.partition]
                    and any((p.request_id, s) in started for s in p.seeds)]

        def a_committed() -> int:
            offsets = so.committed(bootstrap, prefix)
            return sum(offsets[p.partition] > p.offset for p in on_a)

        so.wait_for(lambda: a_committed() >= 2 and a_in_flight(), "A mid-request after two commits", 240,
                    list(workers.values()), interval=0.05)
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        at_kill = so.committed(bootstrap, prefix)  # A can commit nothing more
        in_flight = {p.request_id for p in on_a if p.offset >= at_kill[p.partition]
                     and any((p.request_id, s) in log.snapshot()[0] for s in p.seeds)}
        done_before = {p.request_id for p in placed if p.offset < at_kill[p.partition]}
        assert len(in_flight) == 1, f"one process serves one request at a time, in flight: {in_flight}"

        time.sleep(2)
        workers["a"] = so.start_worker(tmp_path / "a", bootstrap, prefix)
        so.wait_for(lambda: so.served(bootstrap, prefix, placed), "every request committed", 300,
                    [w for name, w in workers.items()])
        keys = {(p.request_id, s) for p in placed for s in p.seeds}
        log.wait_for(keys)
        started, ended = log.snapshot()
    finally:
        so.stop_workers(list(workers.values()))
        log.close()

    assert set(started) == keys, "episodes of requests nobody asked for, or requests never run"
    for key in keys:
        copies = started[key]
        assert len(set(copies)) == 1, f"{key}: re-run with other ids {copies}"
        (_, episode_id), = set(copies)
        assert len(set(ended[episode_id])) == 1, f"{key}: ended with different ids or steps {ended[episode_id]}"
    reran = {request for (request, _), copies in started.items() if len(copies) > 1}
    assert reran <= in_flight, f"requests run twice that were not in flight at the kill: {reran - in_flight}"
    assert reran, "the request in flight at the kill had started episodes: they must have run again"
    assert not reran & done_before, "a request committed before the kill ran again"
    runs = Counter(len(started[(p.request_id, s)]) for p in placed for s in p.seeds if p.request_id not in in_flight)
    assert set(runs) == {1}, f"requests not in flight at the kill ran more than once: {runs}"
    served_by_b = [p for p in placed if p.partition not in parts_a and p.request_id not in in_flight]
    assert served_by_b, "B served nothing: the group did not share the requests"
