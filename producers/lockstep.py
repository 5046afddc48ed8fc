"""Lock-step batching of policy calls: several envs, one call for all their observations.

Each env runs on a lane (a thread of its own, producers/rollout_worker.py run_lanes) and asks for
its next action chunk through a Lane. The Batcher sends one call when every lane that is still
running waits for a reply, so a call carries as many observations as there are running lanes;
a lane whose seeds are done leaves, and the rest no longer wait for it. A policy server that
answers in L seconds whatever the batch then serves n envs at n/L observations/s instead of 1/L.

What the call does is the caller's (``call``: a list of requests -> a list of replies, in order);
an exception from it reaches every lane of that call.

Lanes that share a process take turns (``turn``, one lock for all of a process's Batchers): a lane
holds it while it steps its env and lets go of it only while it waits for a reply. Stepping is
Python under the GIL, so running the lanes side by side gains nothing; it costs a great deal:
MuJoCo's calls let go of the GIL, and 16 threads handing it to each other at every call used
2.5x the CPU per step of one (bench/policy_serving.py).

    batcher = Batcher(connection.infer)
    lanes = [batcher.join() for _ in range(4)]   # all lanes join before any of them asks
    with lanes[0]:                               # in the lane's own thread: its turn to step
        chunk = lanes[0].infer(request)          # blocks until the other running lanes asked too
                                                 # leaves when its seeds are done
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any


class Batcher:
    def __init__(self, call: Callable[[list[Any]], list[Any]], turn: threading.Lock | None = None):
        self._call = call
        self.turn = turn if turn is not None else threading.Lock()
        self._cond = threading.Condition()
        self._running = 0  # lanes joined and not left
        self._lanes = 0
        self._waiting: dict[int, Any] = {}  # lane -> its request, until the call that carries it
        self._replies: dict[int, Any] = {}  # lane -> its reply (or the call's exception)
        self.calls = 0
        self.batch_sizes: list[int] = []  # observations per call, in call order

    def join(self) -> Lane:
        with self._cond:
            self._running += 1
            self._lanes += 1
            return Lane(self, self._lanes - 1)

    def _infer(self, lane: int, request: Any) -> Any:
        with self._cond:
            self._waiting[lane] = request
            if len(self._waiting) == self._running:
                self._send()
            else:
                self._cond.wait_for(lambda: lane in self._replies)
            reply = self._replies.pop(lane)
        if isinstance(reply, BaseException):
            raise _copy(reply) from reply  # a copy per lane: each raises it in its own thread
        return reply

    def _leave(self) -> None:
        with self._cond:
            self._running -= 1
            if self._waiting and len(self._waiting) == self._running:
                self._send()  # the lanes still running were waiting for this one only

    def _send(self) -> None:
        # Called with the lock held, and the lock stays held through the call: every running lane
        # is waiting for it, so there is nobody to let in.
        lanes = sorted(self._waiting)
        requests = [self._waiting.pop(lane) for lane in lanes]
        self.calls += 1
        self.batch_sizes.append(len(requests))
        try:
            replies = self._call(requests)
            if len(replies) != len(requests):
                raise ValueError(f"{len(replies)} replies to a call of {len(requests)} requests")
        except Exception as exc:
            replies = [exc] * len(requests)
        self._replies.update(zip(lanes, replies, strict=True))
        self._cond.notify_all()


def _copy(exc: BaseException) -> BaseException:
    try:
        return copy.copy(exc)
    except Exception:  # an exception type copy cannot rebuild: share the one
        return exc


class Lane:
    """One env's way to the Batcher: ``infer`` while its episodes run, ``leave`` once when done."""

    def __init__(self, batcher: Batcher, index: int):
        self._batcher, self.index = batcher, index
        self._left = False

    def __enter__(self) -> Lane:
        """Takes the lane's turn to step (see the module's docstring); the exit leaves the Batcher."""
        self._batcher.turn.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._batcher.turn.release()
        self.leave()

    def infer(self, request: Any) -> Any:
        """The reply to ``request``, once the call that carries it returns; the turn is let go of
        meanwhile, so the other lanes step."""
        self._batcher.turn.release()
        try:
            return self._batcher._infer(self.index, request)
        finally:
            self._batcher.turn.acquire()

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self._batcher._leave()
