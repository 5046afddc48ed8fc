"""producers/lockstep.py: lanes on threads of their own, one call for every running lane's request."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from producers.lockstep import Batcher


def run_lanes(batcher: Batcher, work: dict[int, list[int]]) -> dict[int, list]:
    """Each lane (key) asks for each of its requests in turn, then leaves; its replies, or the
    exception it raised."""
    lanes = {key: batcher.join() for key in work}  # all join before any asks

    def lane(key: int) -> list:
        replies = []
        with lanes[key]:
            try:
                for request in work[key]:
                    replies.append(lanes[key].infer(request))
            except Exception as exc:  # noqa: BLE001  (the test looks at it)
                replies.append(exc)
        return replies

    with ThreadPoolExecutor(len(work)) as pool:
        futures = {key: pool.submit(lane, key) for key in work}
        return {key: f.result(timeout=10) for key, f in futures.items()}


def test_every_call_carries_each_running_lane_and_a_lane_that_left_is_not_waited_for():
    calls = []
    batcher = Batcher(lambda requests: calls.append(sorted(requests)) or [r * 10 for r in requests])
    replies = run_lanes(batcher, {0: [1, 2, 3], 1: [100], 2: [1000, 2000]})
    assert replies == {0: [10, 20, 30], 1: [1000], 2: [10000, 20000]}
    # three lanes, then two (lane 1 left after one request), then one: no call waited for a lane gone
    assert calls == [[1, 100, 1000], [2, 2000], [3]]
    assert (batcher.calls, batcher.batch_sizes) == (3, [3, 2, 1])


def test_a_failed_call_raises_in_every_lane_it_carried_and_the_next_call_still_runs():
    def call(requests):
        if "bad" in requests:
            raise ConnectionError("server gone")
        return requests

    replies = run_lanes(Batcher(call), {0: ["bad"], 1: ["ok"], 2: ["fine"]})
    assert [type(r[0]).__name__ for r in replies.values()] == ["ConnectionError"] * 3
    assert all(str(r[0]) == "server gone" for r in replies.values())
    assert len({id(r[0]) for r in replies.values()}) == 3  # a copy each: raised in three threads

    again = run_lanes(Batcher(call), {0: ["ok"], 1: ["fine"]})
    assert again == {0: ["ok"], 1: ["fine"]}


def test_a_reply_count_that_does_not_match_the_call_is_an_error_in_each_lane():
    replies = run_lanes(Batcher(lambda requests: requests[:1]), {0: [1], 1: [2]})
    for reply in replies.values():
        assert isinstance(reply[0], ValueError) and str(reply[0]) == "1 replies to a call of 2 requests"


def test_lanes_take_turns_to_step_and_let_go_of_the_turn_while_they_wait():
    turn = threading.Lock()
    holding = []  # how many lanes stepped at once, seen by each lane as it steps
    inside = [0]
    guard = threading.Lock()

    def call(requests):
        assert not turn.locked()  # every lane waits for this call: none holds the turn
        return requests

    batcher = Batcher(call, turn)
    lanes = [batcher.join() for _ in range(4)]

    def lane(i: int) -> None:
        with lanes[i]:
            for step in range(20):
                with guard:
                    inside[0] += 1
                    holding.append(inside[0])
                threading.Event().wait(0.0005)  # an env step
                with guard:
                    inside[0] -= 1
                lanes[i].infer(step)

    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(lane, i) for i in range(4)]:
            f.result(timeout=10)
    assert max(holding) == 1 and len(holding) == 80
    assert not turn.locked() and batcher.batch_sizes == [4] * 20


def test_a_lane_that_leaves_twice_counts_once():
    batcher = Batcher(lambda requests: requests)
    first, second, third = batcher.join(), batcher.join(), batcher.join()
    first.leave()
    first.leave()  # counted twice, the call below would go out without waiting for the third lane
    replies = run_lanes_joined(batcher, {1: second, 2: third})
    assert replies == {1: 7, 2: 8} and batcher.batch_sizes == [2]


def run_lanes_joined(batcher: Batcher, lanes: dict) -> dict:
    def ask(key):
        with lanes[key]:
            return lanes[key].infer(6 + key)

    with ThreadPoolExecutor(len(lanes)) as pool:
        futures = {key: pool.submit(ask, key) for key in lanes}
        return {key: f.result(timeout=10) for key, f in futures.items()}
