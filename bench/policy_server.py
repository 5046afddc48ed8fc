"""A local openpi policy server with a fixed latency per call, for benches and tests.

It speaks the openpi protocol (msgpack-numpy over WebSocket, metadata on connect) and the stacked
form of it (producers/websocket_policy.py): a message with ``batch_size`` B holds each observation
key stacked on a leading axis and is answered with actions of shape (B, chunk, 7). Each call is
answered ``latency_s`` after it arrived, whatever its batch: a model on a GPU takes about as long
for 16 observations as for one. ``serial`` makes calls wait for each other (one model answering
one call at a time, as openpi's own server does); otherwise calls from several connections are
answered side by side.

The actions are a function of each observation alone (a proportional reach for a point above the
table, from ``observation/state``'s first three numbers: the end effector's position), so the same
seed gives the same episode however the calls were batched.

    with LatencyPolicyServer(latency_s=0.05) as server:
        server.uri                        # ws://127.0.0.1:<port>
        server.calls, server.observations

    python bench/policy_server.py --latency-ms 50     # serves until interrupted
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import numpy as np
from openpi_client import msgpack_numpy
from websockets.sync.server import serve

TARGET = np.array([0.0, 0.05, 1.0])  # above Lift's table, off its centre
ACTION_DIM = 7
STATE_KEY = "observation/state"


def reach(state: np.ndarray, chunk: int) -> np.ndarray:
    """(chunk, 7) actions for one observation's state: steer the end effector to TARGET, gripper open."""
    action = np.zeros(ACTION_DIM)
    action[:3] = np.clip(4.0 * (TARGET - np.asarray(state, dtype=float)[:3]), -1.0, 1.0)
    action[6] = -1.0
    return np.repeat(action[None, :], chunk, axis=0)


class LatencyPolicyServer:
    def __init__(self, latency_s: float = 0.05, chunk: int = 1, serial: bool = True, port: int = 0):
        self.latency_s, self.chunk, self.serial = latency_s, chunk, serial
        self.calls = 0
        self.observations = 0
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()  # held through a call's latency when serial
        self._count = threading.Lock()
        self.server = serve(self._handle, "127.0.0.1", port, compression=None, max_size=None)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        host, port = self.server.socket.getsockname()[:2]
        self.uri = f"ws://{host}:{port}"

    def _handle(self, conn) -> None:
        conn.send(msgpack_numpy.packb({"server": "bench.policy_server", "latency_s": self.latency_s}))
        for message in conn:
            obs = msgpack_numpy.unpackb(message)
            if self.serial:
                with self._lock:  # the call holds the model from here to its answer
                    actions = self._answer(obs, time.monotonic())
            else:
                actions = self._answer(obs, time.monotonic())
            conn.send(msgpack_numpy.packb({"actions": actions}))

    def _answer(self, obs: dict[str, Any], started: float) -> np.ndarray:
        if "batch_size" in obs:
            actions = np.stack([reach(state, self.chunk) for state in obs[STATE_KEY]])
        else:
            actions = reach(obs[STATE_KEY], self.chunk)
        self._count_call(len(actions) if "batch_size" in obs else 1)
        time.sleep(max(0.0, self.latency_s - (time.monotonic() - started)))
        return actions

    def _count_call(self, observations: int) -> None:
        with self._count:
            self.calls += 1
            self.observations += observations
            self.batch_sizes.append(observations)

    def __enter__(self) -> LatencyPolicyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--chunk", type=int, default=1, help="actions per observation")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--concurrent", action="store_true", help="answer calls side by side, not one at a time")
    args = parser.parse_args()
    with LatencyPolicyServer(args.latency_ms / 1000, args.chunk, serial=not args.concurrent, port=args.port) as s:
        print(f"serving {s.uri} (latency {args.latency_ms:g} ms per call)", flush=True)
        try:
            s.thread.join()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
