"""Learned pixel policies, graded by training budget: do they order by budget, and do they feel the
axes no pose-reading model feels (colour)?

1. Records oracle demonstrations on Lift with two cameras (agentview, robot0_eye_in_hand) at
   ``--size`` pixels, through the rollout loop and the recorder as the rollout worker records them,
   into a chDB evidence store, and exports them with ``export_lerobot`` (LeRobot v3.0, AV1 videos).
2. Trains one policy per budget (demonstrations x steps) in the LeRobot venv
   (``python -m producers.learned.train``), each from the same seed.
3. Serves each behind its openpi server (``python -m producers.learned.server``, 127.0.0.1) and
   runs it as a websocket model (producers/websocket_policy.py, the cameras rendered before every
   action) on held-out seeds (producers/seeds.py) of the base scenario and of a colour variant (a
   green cube: the demonstrations' cube is red), beside the oracle (a pose reader) on the same seeds.

Prints per policy its budget, training time, and success with 95% Wilson intervals on both.

Usage:
    python bench/learned.py [--demos 30] [--budgets 5x100,10x300,30x300,30x1500] [--seeds 20]
                            [--size 64] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's info lines (dozens per video) off, as the export CLI does

import producers.sim  # noqa: E402,F401  (headless GL before mujoco)
from consumers.evidence.store import ClickHouseStore, migrate  # noqa: E402
from consumers.exports.lerobot import export_lerobot  # noqa: E402
from consumers.exports.output import ExportFilters  # noqa: E402
from consumers.statistics import wilson_interval  # noqa: E402
from infra.lerobot_venv import LeRobotVenv  # noqa: E402
from producers.keyframes import KeyframeStore  # noqa: E402
from producers.recorder import EpisodeIdentity, record_episode  # noqa: E402
from producers.seeds import held_out_seeds, selection_seeds  # noqa: E402
from producers.sim.envs import make_env  # noqa: E402
from producers.sim.policies import OracleScripted  # noqa: E402
from producers.sim.rollout import Episode  # noqa: E402
from producers.websocket_policy import WebSocketPolicy  # noqa: E402
from schemas.scenario import ScenarioSpec  # noqa: E402
from tests.store_events import Collect, store_events  # noqa: E402

CAMERAS = ("agentview", "robot0_eye_in_hand")
LAYOUT = {"observation/images/agentview": ("agentview_image",),
          "observation/images/robot0_eye_in_hand": ("robot0_eye_in_hand_image",),
          "observation/state": ("joint_pos", "eef_pos", "eef_quat", "gripper_opening")}
BASE = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube")
GREEN = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube", object_rgba=(0.1, 0.8, 0.2, 1.0))


def record_demos(work: Path, n: int, size: int) -> Path:
    env = make_env(BASE, keyframes=True)
    keyframes, sink = KeyframeStore(work / "keyframes"), Collect()
    for seed in selection_seeds(n):
        identity = EpisodeIdentity(run_id="demos", benchmark="robosuite", task="Lift", scenario=BASE.to_dict(),
                                   model_id="oracle", model_version="1", seed=seed)
        record_episode(Episode(env, OracleScripted(), seed, cameras=CAMERAS, camera_size=size), sink, identity,
                       keyframes)
    env.close()
    store = ClickHouseStore.connect(None, work / "chdb", "bench")
    migrate(store)
    store_events(store, sink.events)
    demos = work / "demos"
    summary = export_lerobot(store, demos, work / "keyframes", ExportFilters(outcome="success", model_id="oracle"))
    print(f"demonstrations: {summary.episodes} oracle successes of {n}, {summary.frames} frames -> {demos}", flush=True)
    return demos


def train(venv: LeRobotVenv, demos: Path, output: Path, episodes: int, steps: int, seed: int,
          words: bool = False) -> dict:
    """One policy of the family (``words``: it reads the instruction, for multi-task data)."""
    proc = subprocess.run([str(venv.python), "-m", "producers.learned.train", "--dataset", str(demos), "--output",
                           str(output), "--episodes", str(episodes), "--steps", str(steps), "--seed", str(seed),
                           *([] if words else ["--no-words"])], env=venv.environ(ROOT), cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"training {output.name} failed: {proc.stderr[-2000:]}")
    return json.loads((output / "policy.json").read_text())["training"]


def success(policy_factory, spec: ScenarioSpec, seeds: list[int], cameras: tuple[str, ...], size: int) -> int:
    env = make_env(spec, keyframes=True)
    wins = 0
    for seed in seeds:
        policy = policy_factory()
        episode = Episode(env, policy, seed, policy_cameras=cameras, policy_camera_size=size)
        for _ in episode:
            pass
        if hasattr(policy, "close"):
            policy.close()
        wins += episode.outcome.success
    env.close()
    return wins


def venv_and_work(keep: Path | None, prefix: str) -> tuple[LeRobotVenv | None, Path]:
    """The LeRobot venv (None, said on stderr, when it is not set up) and the work dir (``keep``, or
    a new temporary one)."""
    venv = LeRobotVenv.at()
    if not venv.ready():
        print(f"LeRobot is not set up at {venv.root}: run `sepa-eval lerobot setup`", file=sys.stderr)
        return None, Path()
    work = keep or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    return venv, work


def rate(wins: int, n: int) -> str:
    low, high = wilson_interval(wins, n)
    return f"{wins / n:.2f} [{low:.2f}, {high:.2f}]"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", type=int, default=30)
    parser.add_argument("--budgets", default="5x100,10x300,30x300,30x1500", help="demonstrations x steps, ...")
    parser.add_argument("--seeds", type=int, default=20, help="held-out seeds per scenario")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args(argv)
    venv, work = venv_and_work(args.keep, "sepa-learned-")
    if venv is None:
        return 2
    budgets = [tuple(int(x) for x in b.split("x")) for b in args.budgets.split(",")]
    seeds = held_out_seeds(args.seeds)
    t0 = time.monotonic()
    try:
        demos = record_demos(work, args.demos, args.size)
        oracle = [success(OracleScripted, spec, seeds, (), args.size) for spec in (BASE, GREEN)]
        rows = [("oracle (pose reader)", "-", "-", oracle)]
        for episodes, steps in budgets:
            name = f"pixel-bc-{episodes}x{steps}"
            training = train(venv, demos, work / name, episodes, steps, args.seed)
            server = subprocess.Popen([str(venv.python), "-m", "producers.learned.server", "--policy",
                                       str(work / name)], env=venv.environ(ROOT), cwd=ROOT, stdout=subprocess.PIPE,
                                      text=True)
            try:
                uri = server.stdout.readline().split(" on ")[1].strip()
                wins = [success(lambda uri=uri: WebSocketPolicy(uri, 7, observation=LAYOUT), spec, seeds, CAMERAS,
                                args.size) for spec in (BASE, GREEN)]
            finally:
                server.terminate()
                server.wait(timeout=30)
            rows.append((name, f"{training['episodes']}x{steps}", f"{training['wall_s']:.0f}", wins))
            print(f"{name}: trained in {training['wall_s']:.0f} s (loss {training['final_loss']:.3f}); base "
                  f"{rate(wins[0], len(seeds))}, green cube {rate(wins[1], len(seeds))}", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nheld-out seeds: {len(seeds)} per scenario; cameras {', '.join(CAMERAS)} at {args.size} px")
    print(f"{'policy':24s} {'budget':>8s} {'train s':>8s}   {'base Lift':18s} {'green cube':18s}")
    for name, budget, seconds, (base, green) in rows:
        print(f"{name:24s} {budget:>8s} {seconds:>8s}   {rate(base, len(seeds)):18s} {rate(green, len(seeds)):18s}")
    print(f"total wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
