"""External VLA policies served over the openpi protocol (msgpack-numpy over WebSocket).

The server sends its metadata on connect; each request is an observation dict, each reply a dict
whose ``actions`` holds an action chunk (H x action_dim, or one action). openpi-client speaks
the protocol; its ActionChunkBroker hands out one action per control step and asks again when
the chunk is spent. Anything the server does wrong (disconnects, errors, a malformed or
non-finite chunk) raises PolicyServerError, which the rollout ends as ``policy_error``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from producers.exceptions import ProducerError


class PolicyServerError(ProducerError):
    """The policy server disconnected, reported an error or returned a malformed action chunk."""


class WebSocketPolicy:
    """A Policy (reset/act) backed by an openpi policy server."""

    def __init__(self, uri: str, action_dim: int, connect_timeout_s: float = 10.0):
        self.uri = uri
        self.action_dim = action_dim
        self.connect_timeout_s = connect_timeout_s
        self._client: WebsocketClientPolicy | None = None
        self._chunk: np.ndarray | None = None
        self._cursor = 0
        self._instruction = ""

    def _connect(self) -> WebsocketClientPolicy:
        if self._client is None:
            try:
                self._client = WebsocketClientPolicy(self.uri)
            except Exception as exc:
                raise PolicyServerError(f"cannot reach the policy server at {self.uri}: {exc!r}") from exc
        return self._client

    def reset(self, seed: int, spec: Any) -> None:
        self._chunk, self._cursor = None, 0
        self._instruction = getattr(spec, "instruction", "")
        self._connect()

    def act(self, obs: dict[str, Any], signals: dict[str, Any]) -> np.ndarray:
        if self._chunk is None or self._cursor >= len(self._chunk):
            self._chunk, self._cursor = self._request(obs), 0
        action = self._chunk[self._cursor]
        self._cursor += 1
        return action

    def _request(self, obs: dict[str, Any]) -> np.ndarray:
        request = {k: np.asarray(v) for k, v in obs.items()}
        request["prompt"] = self._instruction
        try:
            reply = self._connect().infer(request)
        except Exception as exc:
            self.close()  # a broken connection is not reused by the next episode
            raise PolicyServerError(f"policy server {self.uri} failed: {exc!r}") from exc
        if not isinstance(reply, dict) or "actions" not in reply:
            raise PolicyServerError(f"policy server {self.uri} replied without 'actions': {str(reply)[:200]}")
        try:
            chunk = np.asarray(reply["actions"], dtype=float)
        except (TypeError, ValueError) as exc:
            raise PolicyServerError(f"policy server {self.uri}: actions are not numbers: {exc}") from exc
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
