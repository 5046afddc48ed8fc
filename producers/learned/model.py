"""The learned policy: what it sees, how it acts, and how it is saved.

Inputs (no privileged object state): one RGB frame per camera (uint8, camera_size square), the
proprioceptive state (the LeRobot export's ``observation.state``: joint positions, grip-site
position and quaternion, gripper opening; the Step's signals after the previous action, which is
what a policy sees before it acts) and the instruction, as a hashed bag of words (no tokenizer or
embedding to download). Output: a chunk of ``chunk`` actions, executed open loop before the next
request (openpi's action chunking).

    policy = PixelPolicy(PolicyConfig(cameras=("agentview",), state_dim=15, action_dim=7))
    actions = policy(images, state, tokens)           # (B, chunk, action_dim), normalized
    save(policy, stats, directory, training={...}); policy, stats = load(directory)
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

VOCABULARY = 1024  # hashed word buckets
MAX_WORDS = 16
WEIGHTS = "model.pt"
CONFIG = "policy.json"


@dataclass(frozen=True)
class PolicyConfig:
    cameras: tuple[str, ...]  # the export's camera names (observation.images.<camera>)
    state_dim: int
    action_dim: int
    camera_size: int = 64
    chunk: int = 8  # actions per request
    hidden: int = 256
    words: bool = True  # read the instruction (multi-task suites); off: the instruction is ignored

    def __post_init__(self) -> None:
        if not self.cameras:
            raise ValueError("a pixel policy needs at least one camera")
        for name in ("state_dim", "action_dim", "camera_size", "chunk", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"PolicyConfig.{name} must be >= 1, got {getattr(self, name)}")


def word_ids(text: str) -> list[int]:
    """The instruction as hashed word ids (1..VOCABULARY-1; 0 pads), lower-cased, at most MAX_WORDS."""
    words = re.findall(r"[a-z0-9]+", text.lower())[:MAX_WORDS]
    return [1 + zlib.crc32(w.encode()) % (VOCABULARY - 1) for w in words]


def word_tensor(texts: list[str]) -> torch.Tensor:
    ids = [word_ids(t) + [0] * (MAX_WORDS - len(word_ids(t))) for t in texts]
    return torch.tensor(ids, dtype=torch.long)


class _Camera(nn.Module):
    def __init__(self, size: int, out: int):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 32, 5, stride=2, padding=2), nn.ReLU(),
                                  nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU())
        side = (size + 7) // 8
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * side * side, out), nn.ReLU())

    def forward(self, image: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) in [0, 1]
        return self.head(self.conv(image))


class PixelPolicy(nn.Module):
    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.config = config
        h = config.hidden
        self.cameras = nn.ModuleList(_Camera(config.camera_size, h) for _ in config.cameras)
        self.state = nn.Sequential(nn.Linear(config.state_dim, h), nn.ReLU())
        self.words = nn.EmbeddingBag(VOCABULARY, h, mode="mean", padding_idx=0) if config.words else None
        parts = len(config.cameras) + 1 + (1 if config.words else 0)
        self.head = nn.Sequential(nn.Linear(parts * h, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                                  nn.Linear(h, config.chunk * config.action_dim))

    def forward(self, images: list[torch.Tensor], state: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        feats = [enc(img) for enc, img in zip(self.cameras, images, strict=True)] + [self.state(state)]
        if self.words is not None:
            feats.append(self.words(words))
        out = self.head(torch.cat(feats, dim=-1))
        return out.view(-1, self.config.chunk, self.config.action_dim)


@dataclass
class Normalizer:
    """Mean/std of state and action from the dataset's meta/stats.json (std floored: a constant
    dimension, such as an unused action, must not divide by zero)."""

    state_mean: list[float]
    state_std: list[float]
    action_mean: list[float]
    action_std: list[float]
    floor: float = field(default=1e-3)

    @classmethod
    def from_stats(cls, stats: dict) -> Normalizer:
        s, a = stats["observation.state"], stats["action"]
        return cls([float(v) for v in np.ravel(s["mean"])], [float(v) for v in np.ravel(s["std"])],
                   [float(v) for v in np.ravel(a["mean"])], [float(v) for v in np.ravel(a["std"])])

    def state(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = torch.tensor(self.state_mean), torch.tensor(self.state_std).clamp_min(self.floor)
        return (x - mean) / std

    def action(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = torch.tensor(self.action_mean), torch.tensor(self.action_std).clamp_min(self.floor)
        return (x - mean) / std

    def unaction(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = torch.tensor(self.action_mean), torch.tensor(self.action_std).clamp_min(self.floor)
        return x * std + mean


def save(policy: PixelPolicy, normalizer: Normalizer, directory: Path, training: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(policy.state_dict(), directory / WEIGHTS)
    (directory / CONFIG).write_text(json.dumps({"policy": asdict(policy.config), "normalizer": asdict(normalizer),
                                                "training": training}, indent=1))


def load(directory: Path) -> tuple[PixelPolicy, Normalizer, dict]:
    """(policy in eval mode, normalizer, training record) of a saved policy; raises FileNotFoundError
    or ValueError naming the directory."""
    config_path = directory / CONFIG
    if not config_path.is_file() or not (directory / WEIGHTS).is_file():
        raise FileNotFoundError(f"{directory} holds no trained policy ({CONFIG} and {WEIGHTS})")
    saved = json.loads(config_path.read_text())
    config = PolicyConfig(**{**saved["policy"], "cameras": tuple(saved["policy"]["cameras"])})
    policy = PixelPolicy(config)
    policy.load_state_dict(torch.load(directory / WEIGHTS, map_location="cpu", weights_only=True))
    policy.eval()
    return policy, Normalizer(**saved["normalizer"]), saved["training"]
