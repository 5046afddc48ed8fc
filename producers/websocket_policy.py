"""External VLA policies served over the openpi protocol (msgpack-numpy over WebSocket).

The server sends its metadata on connect; each request is an observation dict, each reply a dict
whose ``actions`` holds an action chunk (H x action_dim, or one action); the policy hands out one
action per control step and asks again when the chunk is spent, as openpi's ActionChunkBroker
does. Messages are openpi-client's msgpack-numpy; the connection is ours, so that every wait has
a limit (openpi's client waits for a reply for ever, and a hung server would hang the worker).
Two kinds of failure, two outcomes:
- the server cannot be reached, disconnects, or does not answer within ``reply_timeout_s``
  (PolicyServerUnavailable): the harness failed, not the policy, so the episode ends ``env_error``
  naming the server and the reason, and counts in no success rate;
- the server answers with an error or a malformed or non-finite chunk (PolicyServerError): the
  policy failed, and the episode ends ``policy_error``.

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

from contextlib import ExitStack
from typing import Any

import numpy as np
from openpi_client import msgpack_numpy
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from producers.exceptions import ProducerError
from producers.lockstep import Lane

# How long a policy server may take to accept a connection (and send its metadata), and to answer
# one call, s. A VLA on a GPU answers in well under a second, a CPU model in a few; a call that
# takes longer is a server that hangs.
CONNECT_TIMEOUT_S = 10.0
REPLY_TIMEOUT_S = 120.0


class PolicyServerError(ProducerError):
    """The policy server reported an error or returned a malformed action chunk: the policy's failure."""


class PolicyServerUnavailable(PolicyServerError):
    """The policy server could not be reached, disconnected or did not answer in time: the harness's
    failure, so the episode ends env_error (producers/episode.py reads ``termination``)."""

    termination = "env_error"


class PolicyServerConnection:
    """One connection to a policy server, opened on first use and reopened after a failure.
    ``infer`` makes one call: a single request as openpi sends it, or (``batched``) a stacked one."""

    def __init__(self, uri: str, action_dim: int, batched: bool = False, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 reply_timeout_s: float = REPLY_TIMEOUT_S):
        self.uri, self.action_dim, self.batched = uri, action_dim, batched
        self.connect_timeout_s, self.reply_timeout_s = connect_timeout_s, reply_timeout_s
        self._ws: ClientConnection | None = None
        self._open = ExitStack()  # the connection, entered as websockets wants it (a context), closed by close()
        self.metadata: dict | None = None

    def connect(self) -> ClientConnection:
        if self._ws is None:
            try:
                ws = self._open.enter_context(ws_connect(self.uri, compression=None, max_size=None,
                                                         open_timeout=self.connect_timeout_s))
            except Exception as exc:
                raise PolicyServerUnavailable(f"cannot reach the policy server at {self.uri}: {exc!r}") from exc
            try:
                self.metadata = msgpack_numpy.unpackb(ws.recv(timeout=self.connect_timeout_s))
            except TimeoutError:
                self._open.close()
                raise PolicyServerUnavailable(f"policy server {self.uri} sent no metadata within "
                                              f"{self.connect_timeout_s:g} s of the connection") from None
            except Exception as exc:
                self._open.close()
                raise PolicyServerUnavailable(f"policy server {self.uri} failed at connect: {exc!r}") from exc
            self._ws = ws
        return self._ws

    def _call(self, message: dict[str, Any]) -> Any:
        ws = self.connect()
        try:
            ws.send(msgpack_numpy.packb(message))
            response = ws.recv(timeout=self.reply_timeout_s)
        except TimeoutError:
            self.close()
            raise PolicyServerUnavailable(f"policy server {self.uri} did not answer within "
                                          f"{self.reply_timeout_s:g} s") from None
        except Exception as exc:
            self.close()  # a broken connection is not reused by the next call
            raise PolicyServerUnavailable(f"policy server {self.uri} failed: {exc!r}") from exc
        if isinstance(response, str):  # openpi's server sends its traceback as text, then closes
            self.close()
            raise PolicyServerError(f"policy server {self.uri} raised: {response[-500:]}")
        try:
            return msgpack_numpy.unpackb(response)
        except Exception as exc:
            raise PolicyServerError(f"policy server {self.uri} replied with unreadable bytes: {exc!r}") from exc

    def infer(self, requests: list[dict[str, Any]]) -> list[np.ndarray]:
        """The action chunks (H x action_dim) answering ``requests``, in order."""
        if not self.batched and len(requests) != 1:
            raise PolicyServerError(f"policy server {self.uri} takes one observation per call, not {len(requests)}")
        reply = self._call(_stacked(requests) if self.batched else requests[0])
        if isinstance(reply, dict) and "error" in reply and "actions" not in reply:
            raise PolicyServerError(f"policy server {self.uri} refused the request: {str(reply['error'])[:300]}")
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
        self._ws = None
        try:
            self._open.close()
        except Exception:  # closing a connection that already broke tells us nothing more
            pass


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

    def __init__(self, uri: str, action_dim: int, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 observation: dict[str, tuple[str, ...]] | None = None, name: str = "websocket",
                 lane: Lane | None = None, reply_timeout_s: float = REPLY_TIMEOUT_S):
        self.uri = uri
        self.action_dim = action_dim
        self.observation = observation
        self.name = name
        self.lane = lane
        self._connection = (PolicyServerConnection(uri, action_dim, connect_timeout_s=connect_timeout_s,
                                                   reply_timeout_s=reply_timeout_s) if lane is None else None)
        self._chunk: np.ndarray | None = None
        self._cursor = 0
        self._instruction = ""

    def reset(self, seed: int, spec: Any) -> None:
        self._chunk, self._cursor = None, 0
        self._instruction = getattr(spec, "instruction", "")
        if self._connection is not None:
            self._connection.connect()

    def looks_now(self) -> bool:
        """Whether the next act() reads the observation: it asks the server when its chunk is spent
        and plays the chunk open loop otherwise, so a frame rendered between requests goes unseen
        (the episode renders the policy's cameras only when this is true)."""
        return self._chunk is None or self._cursor >= len(self._chunk)

    def act(self, obs: dict[str, Any], signals: dict[str, Any]) -> np.ndarray:
        if self.looks_now():
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
