"""One trained policy behind an openpi policy server: msgpack-numpy over WebSocket, as openpi serves
VLAs (metadata on connect, then one reply per observation), so the rollout worker reaches it as it
reaches any user's model (a models.yaml entry of kind websocket).

    python -m producers.learned.server --policy POLICY [--host 127.0.0.1] [--port 0]

Prints ``serving <policy> on ws://HOST:PORT`` once it listens (port 0: a free one). A request holds
``observation/images/<camera>`` (uint8 camera_size x camera_size x 3) for each camera the policy was
trained on, ``observation/state`` (state_dim numbers, the export's ``observation.state`` layout)
and ``prompt``; the reply's ``actions`` are (chunk, action_dim). A request it cannot read gets
``{"error": reason}`` naming what was wrong, and the server goes on serving: a bad observation never
kills it. Stacked (batched) requests are refused with the reason.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from openpi_client import msgpack_numpy
from websockets.exceptions import ConnectionClosedError
from websockets.sync.server import serve

from producers.learned.model import PixelPolicy, load, word_tensor


class BadObservation(ValueError):
    """A request the policy cannot read; its message is the error reply."""


def image_key(camera: str) -> str:
    return f"observation/images/{camera}"


class LearnedPolicyServer:
    def __init__(self, directory: Path, host: str = "127.0.0.1", port: int = 0):
        self.policy, self.normalizer, self.training = load(directory)
        self.name = directory.name
        self._lock = threading.Lock()  # one forward pass at a time: torch's own threads use the cores
        self.server = serve(self._handle, host, port, compression=None, max_size=None)
        host, port = self.server.socket.getsockname()[:2]
        self.uri = f"ws://{host}:{port}"

    @property
    def metadata(self) -> dict[str, Any]:
        config = self.policy.config
        return {"policy": self.name, "cameras": list(config.cameras), "camera_size": config.camera_size,
                "state_dim": config.state_dim, "action_dim": config.action_dim, "chunk": config.chunk,
                "dataset_sha256": self.training.get("dataset_sha256")}

    def _handle(self, conn) -> None:
        try:
            conn.send(msgpack_numpy.packb(self.metadata))
            for message in conn:
                try:
                    reply = {"actions": self.infer(msgpack_numpy.unpackb(message))}
                except BadObservation as exc:
                    reply = {"error": str(exc)}
                except Exception as exc:  # msgpack itself failed: the bytes were not a request
                    reply = {"error": f"unreadable request: {exc!r}"[:500]}
                conn.send(msgpack_numpy.packb(reply))
        except ConnectionClosedError as exc:
            # a client that went without a close frame (a rollout process stopped mid-episode) ends
            # its own connection only; websockets would log a traceback for each
            print(f"client {conn.remote_address} went without closing: {exc}", flush=True)

    def infer(self, request: Any) -> np.ndarray:
        policy: PixelPolicy = self.policy
        config = policy.config
        if not isinstance(request, dict):
            raise BadObservation(f"a request is a map of observation keys, got {type(request).__name__}")
        if "batch_size" in request:
            raise BadObservation("stacked (batched) requests are not served: send one observation per call")
        images = []
        for camera in config.cameras:
            image = request.get(image_key(camera))
            size = config.camera_size
            if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.shape != (size, size, 3):
                got = (f"{image.dtype} {image.shape}" if isinstance(image, np.ndarray)
                       else "nothing" if image is None else type(image).__name__)
                raise BadObservation(f"{image_key(camera)} must be uint8 ({size}, {size}, 3), got {got}")
            # msgpack-numpy hands out read-only views of the message, which torch warns about sharing
            images.append(torch.from_numpy(image.copy()).permute(2, 0, 1).float().unsqueeze(0) / 255.0)
        state = request.get("observation/state")
        try:
            state = np.array(state, dtype=np.float32).reshape(-1)  # a writable copy, as the images
        except (TypeError, ValueError):
            raise BadObservation(f"observation/state must be {config.state_dim} numbers, got {state!r}"[:300]) from None
        if state.shape != (config.state_dim,) or not np.all(np.isfinite(state)):
            raise BadObservation(f"observation/state must be {config.state_dim} finite numbers, got shape "
                                 f"{state.shape}")
        prompt = request.get("prompt", "")
        if not isinstance(prompt, str):
            raise BadObservation(f"prompt must be a string, got {type(prompt).__name__}")
        with self._lock, torch.no_grad():
            out = policy(images, self.normalizer.state(torch.from_numpy(state).unsqueeze(0)), word_tensor([prompt]))
            actions = self.normalizer.unaction(out)[0]
        return actions.numpy().astype(np.float64)

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def shutdown(self) -> None:
        self.server.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m producers.learned.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True, help="a trained policy's directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        server = LearnedPolicyServer(args.policy, args.host, args.port)
    except (FileNotFoundError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # a rollout pool runs beside it on the same cores
    print(f"serving {server.name} on {server.uri}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
