"""External VLA policies served over the openpi protocol (msgpack-numpy over WebSocket).

The server sends its metadata on connect; each request is an observation dict, each reply a dict
whose ``actions`` holds an action chunk (H x action_dim, or one action). openpi-client speaks
the protocol; its ActionChunkBroker hands out one action per control step and asks again when
the chunk is spent. Anything the server does wrong (disconnects, errors, a malformed or
non-finite chunk) raises PolicyServerError, which the rollout ends as ``policy_error``.

What a request holds: the scenario's instruction as ``prompt``, and the observation either whole
(every observation under its own name) or in the layout the server expects (``observation``: its
key -> the observation keys whose values are flattened and concatenated under it, in order; a key
naming one camera frame, ``<camera>_image``, gets it as the uint8 HxWx3 image it is), as a
models.yaml entry of kind "websocket" names it (producers/sim/models.py, with its ``cameras``).

A model with ``batch`` > 1 (models.yaml) is served in stacked calls: the requests of several envs
(producers/lockstep.py) in one message, each observation key stacked on a leading axis of B,
``prompt`` a list of B instructions and ``batch_size`` B; the reply's ``actions`` are
(B, H, action_dim), or (B, action_dim) for one action each. Row i answers request i.

    policy = WebSocketPolicy("ws://127.0.0.1:8000", action_dim=7,
                             observation={"observation/state": ("robot0_eef_pos", "robot0_gripper_qpos")})
"""

from __future__ import annotations

from typing import Any

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from producers.exceptions import ProducerError
from producers.lockstep import Lane


class PolicyServerError(ProducerError):
    """The policy server disconnected, reported an error or returned a malformed action chunk."""


class PolicyServerConnection:
    """One connection to a policy server, opened on first use and reopened after a failure.
    ``infer`` makes one call: a single request as openpi sends it, or (``batched``) a stacked one."""

    def __init__(self, uri: str, action_dim: int, batched: bool = False):
        self.uri, self.action_dim, self.batched = uri, action_dim, batched
        self._client: WebsocketClientPolicy | None = None

    def connect(self) -> WebsocketClientPolicy:
        if self._client is None:
            try:
                self._client = WebsocketClientPolicy(self.uri)
            except Exception as exc:
                raise PolicyServerError(f"cannot reach the policy server at {self.uri}: {exc!r}") from exc
        return self._client

    def infer(self, requests: list[dict[str, Any]]) -> list[np.ndarray]:
        """The action chunks (H x action_dim) answering ``requests``, in order."""
        if not self.batched and len(requests) != 1:
            raise PolicyServerError(f"policy server {self.uri} takes one observation per call, not {len(requests)}")
        message = _stacked(requests) if self.batched else requests[0]
        try:
            reply = self.connect().infer(message)
        except Exception as exc:
            self.close()  # a broken connection is not reused by the next call
            raise PolicyServerError(f"policy server {self.uri} failed: {exc!r}") from exc
        if not isinstance(reply, dict) or "actions" not in reply:
            raise PolicyServerError(f"policy server {self.uri} replied without 'actions': {str(reply)[:200]}")
        try:
            actions = np.asarray(reply["actions"], dtype=float)
        except (TypeError, ValueError) as exc:
            raise PolicyServerError(f"policy server {self.uri}: actions are not numbers: {exc}") from exc
        if not self.batched:
            return [self._chunk(actions)]
        if actions.ndim not in (2, 3) or actions.shape[0] != len(requests):
            raise PolicyServerError(f"policy server {self.uri}: actions of shape {actions.shape} for a batch of "
                                    f"{len(requests)}, expected ({len(requests)}, H, {self.action_dim})")
        return [self._chunk(row) for row in actions]

    def _chunk(self, chunk: np.ndarray) -> np.ndarray:
        if chunk.ndim == 1:
            chunk = chunk[None, :]
        if chunk.ndim != 2 or chunk.shape[0] == 0 or chunk.shape[1] != self.action_dim:
            raise PolicyServerError(f"policy server {self.uri}: action chunk of shape {chunk.shape}, "
                                    f"expected (H, {self.action_dim})")
        if not np.all(np.isfinite(chunk)):
            raise PolicyServerError(f"policy server {self.uri}: action chunk holds non-finite values")
        return chunk

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client._ws.close()  # openpi-client offers no public close
            except Exception:
                pass
            self._client = None


def _stacked(requests: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {key: np.stack([np.asarray(r[key]) for r in requests])
                               for key in requests[0] if key != "prompt"}
    message["prompt"] = [r["prompt"] for r in requests]
    message["batch_size"] = len(requests)
    return message


def _is_image(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 3


class WebSocketPolicy:
    """A Policy (reset/act) backed by an openpi policy server: on a connection of its own, or
    through a lock-step ``lane`` (producers/lockstep.py) that calls the server for several envs."""

    def __init__(self, uri: str, action_dim: int, connect_timeout_s: float = 10.0,
                 observation: dict[str, tuple[str, ...]] | None = None, name: str = "websocket",
                 lane: Lane | None = None):
        self.uri = uri
        self.action_dim = action_dim
        self.observation = observation
        self.name = name
        self.connect_timeout_s = connect_timeout_s
        self.lane = lane
        self._connection = PolicyServerConnection(uri, action_dim) if lane is None else None
        self._chunk: np.ndarray | None = None
        self._cursor = 0
        self._instruction = ""

    def reset(self, seed: int, spec: Any) -> None:
        self._chunk, self._cursor = None, 0
        self._instruction = getattr(spec, "instruction", "")
        if self._connection is not None:
            self._connection.connect()

    def act(self, obs: dict[str, Any], signals: dict[str, Any]) -> np.ndarray:
        if self._chunk is None or self._cursor >= len(self._chunk):
            self._chunk, self._cursor = self._request(obs, signals), 0
        action = self._chunk[self._cursor]
        self._cursor += 1
        return action

    def _request(self, obs: dict[str, Any], signals: dict[str, Any] | None = None) -> np.ndarray:
        request = self._layout(obs, signals)
        request["prompt"] = self._instruction
        if self.lane is not None:
            return self.lane.infer(request)
        return self._connection.infer([request])[0]

    def _layout(self, obs: dict[str, Any], signals: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The request's observation. A layout's sources are observation keys, or else the Step's
        numeric signals (``eef_pos``, ``joint_pos``, ``gripper_opening``, ...: the same numbers the
        LeRobot export's ``observation.state`` holds, so a policy trained on it is served alike)."""
        if self.observation is None:
            return {k: np.asarray(v) for k, v in obs.items()}
        found = {**(signals or {}), **obs}
        request = {}
        for key, sources in self.observation.items():
            missing = [s for s in sources if s not in found]
            if missing:
                raise PolicyServerError(f"policy server {self.uri} expects {key!r} from observation "
                                        f"{', '.join(map(repr, missing))}, which the simulator does not give "
                                        f"(it gives {', '.join(sorted(found))})")
            if len(sources) == 1 and _is_image(found[sources[0]]):
                request[key] = found[sources[0]]  # a camera's frame goes as the image it is (uint8 HxWx3)
                continue
            parts = [np.asarray(found[s], dtype=float).ravel() for s in sources]
            request[key] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return request

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
