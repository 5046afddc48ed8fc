"""Behaviour cloning of a pixel policy on a LeRobot dataset (our export of oracle demonstrations).

    python -m producers.learned.train --dataset DEMOS --output POLICY [--cameras agentview,robot0_eye_in_hand]
           [--episodes 50] [--steps 2000] [--batch 32] [--chunk 8] [--seed 0] [--no-words]

Runs in the LeRobot venv. The dataset is read through LeRobot's own LeRobotDataset (offline; frames
decoded with PyAV), once, into memory; then ``steps`` Adam steps on the mean squared error of the
normalized action chunk (padding past an episode's end masked). The state a sample is given is the
one LeRobot holds one frame earlier (``delta_timestamps``: -1/fps): the export's state is the
state after each step's action, and a policy acting at t has seen the state after t-1. The budget
(episodes x steps) is what grades a family of policies. The output directory gets the weights and
policy.json: the network, the normalization, and the training record (dataset digest, episodes,
steps, seed, losses, wall time, versions) that a registration carries.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from producers.learned.model import Normalizer, PixelPolicy, PolicyConfig, save, word_tensor


def dataset_digest(root: Path) -> str:
    """sha256 over every file of the dataset (path and bytes), in path order: names what was trained on."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def balanced_episodes(tasks: list[list[str]], n: int) -> list[int]:
    """The first ``n`` episodes taken in turn from each task (the first of every task, then the
    second, ...), so a small budget of a multi-task dataset still covers every task; on one task,
    the first ``n``. ``tasks`` is each episode's task list, in episode order."""
    by_task: dict[str, list[int]] = {}
    for index, names in enumerate(tasks):
        by_task.setdefault(names[0], []).append(index)
    turns: list[int] = []
    for rank in range(max(map(len, by_task.values()), default=0)):
        turns += [indices[rank] for indices in by_task.values() if rank < len(indices)]
    return sorted(turns[:n])


def load_samples(root: Path, cameras: tuple[str, ...], episodes: int | None, chunk: int) -> dict:
    """Every frame of ``episodes`` episodes (balanced_episodes), decoded once: uint8 images per camera, the
    previous frame's state, the action chunk and its padding mask, the task text.

    What ``LeRobotDataset(delta_timestamps={"observation.state": [-1 / fps], "action": [i / fps ...]})``
    gives item by item (indices clamped to the episode, ``action_is_pad`` past its end), read a whole
    episode at a time: its columns from the dataset's table, its frames through LeRobot's
    ``decode_video_frames`` in one pass per camera. Item by item, LeRobot opens and seeks the video
    again for every frame (about 90 frames a second here); tests/integration/test_learned_policy.py
    checks the two give the same tensors."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata
    from lerobot.datasets.video_utils import decode_video_frames

    if not (root / "meta" / "info.json").is_file():  # else LeRobot would look for it on the hub
        raise ValueError(f"{root} is not a LeRobot dataset (no meta/info.json)")
    meta = LeRobotDatasetMetadata("sepa/export", root=root)
    missing = [c for c in cameras if f"observation.images.{c}" not in meta.features]
    if missing:
        raise ValueError(f"{root} has no camera {missing}; its cameras: "
                         f"{[k.removeprefix('observation.images.') for k in meta.camera_keys]}")
    chosen = balanced_episodes(meta.episodes["tasks"], episodes) if episodes else list(range(meta.total_episodes))
    ds = LeRobotDataset("sepa/export", root=root, episodes=chosen, video_backend="pyav")
    rows = ds.hf_dataset[:]
    by_episode: dict[int, list[int]] = {}
    for row, ep in enumerate(rows["episode_index"]):
        by_episode.setdefault(int(ep), []).append(row)
    images: dict[str, list] = {c: [] for c in cameras}
    states, actions, pads, tasks = [], [], [], []
    for ep, ep_rows in by_episode.items():
        n = len(ep_rows)
        state = torch.stack([rows["observation.state"][r] for r in ep_rows])
        action = torch.stack([rows["action"][r] for r in ep_rows])
        ahead = torch.arange(n)[:, None] + torch.arange(chunk)[None, :]
        states.append(state[(torch.arange(n) - 1).clamp(min=0)])
        actions.append(action[ahead.clamp(max=n - 1)])
        pads.append(ahead >= n)
        tasks += [meta.tasks.iloc[int(rows["task_index"][r])].name for r in ep_rows]
        timestamps = [float(rows["timestamp"][r]) for r in ep_rows]
        for c in cameras:
            key = f"observation.images.{c}"
            start = meta.episodes[ep][f"videos/{key}/from_timestamp"]
            images[c].append(decode_video_frames(root / meta.get_video_file_path(ep, key),
                                                 [start + t for t in timestamps], ds.tolerance_s, "pyav",
                                                 return_uint8=True))
    return {"images": {c: torch.cat(v) for c, v in images.items()}, "state": torch.cat(states),
            "action": torch.cat(actions), "pad": torch.cat(pads), "task": tasks,
            "episodes": len(chosen), "stats": meta.stats, "image_size": int(images[cameras[0]][0].shape[-1])}


def train(root: Path, output: Path, cameras: tuple[str, ...], episodes: int | None, steps: int, batch: int,
          chunk: int, seed: int, words: bool, lr: float = 3e-4, log=print) -> dict:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    started = time.monotonic()
    data = load_samples(root, cameras, episodes, chunk)
    loaded_s = time.monotonic() - started
    n = len(data["task"])
    normalizer = Normalizer.from_stats(data["stats"])
    config = PolicyConfig(cameras=cameras, state_dim=data["state"].shape[-1], action_dim=data["action"].shape[-1],
                          camera_size=data["image_size"], chunk=chunk, words=words)
    policy = PixelPolicy(config)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=1e-4)
    state, target = normalizer.state(data["state"]), normalizer.action(data["action"])
    keep = (~data["pad"]).float().unsqueeze(-1)
    word_ids = word_tensor(data["task"])
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        idx = torch.randint(0, n, (batch,), generator=generator)
        images = [data["images"][c][idx].float() / 255.0 for c in cameras]
        predicted = policy(images, state[idx], word_ids[idx])
        loss = (((predicted - target[idx]) ** 2) * keep[idx]).sum() / (keep[idx].sum() * config.action_dim)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"step {step}/{steps}: loss {np.mean(losses[-50:]):.4f}")
    import lerobot

    training = {"dataset": str(root), "dataset_sha256": dataset_digest(root), "episodes": data["episodes"],
                "frames": n, "steps": steps, "batch": batch, "lr": lr, "seed": seed, "chunk": chunk,
                "words": words, "final_loss": float(np.mean(losses[-50:])) if losses else None,
                "load_s": round(loaded_s, 1), "wall_s": round(time.monotonic() - started, 1),
                "torch": torch.__version__, "lerobot": lerobot.__version__}
    save(policy, normalizer, output, training)
    log(f"saved {output}: {json.dumps(training)}")
    return training


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m producers.learned.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, required=True, help="a LeRobot v3.0 dataset directory (our export)")
    parser.add_argument("--output", type=Path, required=True, help="where the trained policy goes")
    parser.add_argument("--cameras", default="agentview,robot0_eye_in_hand")
    parser.add_argument("--episodes", type=int, default=None,
                        help="N episodes, taken in turn from each task (default: all)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-words", action="store_true", help="ignore the instruction (single-task data)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.chunk < 1 or (args.episodes is not None and args.episodes < 1):
        print("error: --steps, --batch, --chunk and --episodes must be >= 1", file=sys.stderr)
        return 2
    cameras = tuple(c.strip() for c in args.cameras.split(",") if c.strip())
    try:
        train(args.dataset, args.output, cameras, args.episodes, args.steps, args.batch, args.chunk, args.seed,
              words=not args.no_words)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
