"""Failed episodes recorded with camera frames, as a rollout with ``--cameras`` stores them: synthetic
starts, steps and ends (producers.synthetic), each Step carrying ``frames`` (camera -> sha256 of a PNG
in the keyframe store), so the LeRobot export turns them into videos.

The pictures are smooth (a gradient with a square moving across it, a little noise) so a lossy codec
reproduces them closely; random noise would not survive AV1 at LeRobot's crf 30."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from producers.keyframes import KeyframeStore
from producers.synthetic import episodes as synthetic_episodes

CAMERAS = {"agentview": (48, 64), "robot0_eye_in_hand": (32, 32)}  # camera -> (height, width)


@dataclass(frozen=True)
class CameraWorld:
    episode_ids: list[str]  # oldest first, as the export orders them
    frames: dict[str, dict[str, list[str]]]  # episode_id -> camera -> sha256 per step
    steps: dict[str, list[dict]]
    keyframes: Path


def picture(rng: np.random.Generator, height: int, width: int, t: int) -> np.ndarray:
    """A smooth (height, width, 3) uint8 picture whose square moves with t."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1),
                     np.full((height, width), 96.0)], axis=-1)
    side = max(height, width) // 4
    top, left = (t * 2) % max(height - side, 1), (t * 3) % max(width - side, 1)
    base[top:top + side, left:left + side] = (230.0, 40.0, 40.0)
    noisy = base + rng.normal(0.0, 2.0, size=base.shape)
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def camera_world_events(keyframe_root: Path, lengths: list[int], cameras: dict[str, tuple[int, int]] | None = None,
                        seed: int = 11) -> tuple[CameraWorld, list[dict]]:
    """One failed episode per length (steps), frames from every camera at every step, written to keyframe_root.
    ``cameras={}`` records an episode without frames."""
    cameras = CAMERAS if cameras is None else cameras
    store = KeyframeStore(keyframe_root)
    rng = np.random.default_rng(seed)
    events: list[dict] = []
    ids: list[str] = []
    frames: dict[str, dict[str, list[str]]] = {}
    steps: dict[str, list[dict]] = {}
    ended = datetime.now(UTC) - timedelta(hours=1)
    for index, length in enumerate(lengths):
        for event in synthetic_episodes(1, length, seed * 1000 + index, "camera-export-test"):
            kind = event["envelope"]["event_type"]
            episode_id = event["episode_id"]
            if kind == "EpisodeStarted":
                ids.append(episode_id)
                frames[episode_id] = {camera: [] for camera in cameras}
                steps[episode_id] = []
            elif kind == "Step":
                shas = {camera: store.put(picture(rng, h, w, event["t"])) for camera, (h, w) in cameras.items()}
                for camera, sha in shas.items():
                    frames[episode_id][camera].append(sha)
                event = {**event, "frames": shas}
                steps[episode_id].append(event)
            else:  # a failure, so the default (hard-case) export selects it; a second apart keeps the order
                envelope = {**event["envelope"], "event_time": ended + timedelta(seconds=index)}
                event = {**event, "envelope": envelope, "success": False, "termination": "timeout",
                         "total_reward": 0.0}
            events.append(event)
    return CameraWorld(ids, frames, steps, keyframe_root), events


__all__ = ["CAMERAS", "CameraWorld", "camera_world_events", "picture"]
