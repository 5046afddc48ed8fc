"""`sepa-eval lerobot ...`: the venv with LeRobot's own code, which reads our exports, and the pixel
policies trained on them there and served like users' VLAs (producers/learned/).

    sepa-eval lerobot setup [--force]     # build the LeRobot venv (idempotent; 1-2 min, ~5 GB the first time)
    sepa-eval lerobot status              # is it set up, and with which versions
    sepa-eval lerobot train --dataset DEMOS --output POLICY [--steps 2000] [--episodes N]
    sepa-eval lerobot serve --policy POLICY [--port 8000]      # an openpi server on 127.0.0.1
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from infra.cli.base import app, console, fail
from infra.exceptions import LeRobotSetupError
from infra.lerobot_venv import LeRobotVenv, build, check

lerobot_app = typer.Typer(help="LeRobot: its own venv (Python 3.12, torch), to read and train on exports.",
                          no_args_is_help=True)
app.add_typer(lerobot_app, name="lerobot")


@lerobot_app.command()
def setup(force: bool = typer.Option(False, "--force", help="rebuild the venv from scratch"),
          cache_root: Path | None = typer.Option(None, help="default ~/.cache/sepa-eval")):
    """Build the LeRobot venv from the package registries (idempotent)."""
    try:
        venv = build(cache_root, force=force, log=lambda line: console.print(line, soft_wrap=True, markup=False))
        report = check(venv)
    except LeRobotSetupError as exc:
        fail(exc)
    console.print(f"LeRobot ready: lerobot {report['lerobot']}, torch {report['torch']}, av {report['av']} "
                  f"at {venv.root}", soft_wrap=True)


@lerobot_app.command()
def status(cache_root: Path | None = typer.Option(None)):
    """Whether LeRobot is set up, and the versions its venv runs."""
    venv = LeRobotVenv.at(cache_root)
    if not venv.ready():
        console.print(f"LeRobot is not set up at {venv.root} (sepa-eval lerobot setup)", soft_wrap=True)
        raise typer.Exit(1)
    try:
        report = check(venv)
    except LeRobotSetupError as exc:
        fail(exc)
    console.print(json.dumps({"venv": str(venv.root), **report}), soft_wrap=True)


def _in_venv(module: str, args: list[str], cache_root: Path | None) -> None:
    """Runs producers.learned.<module> in the LeRobot venv with this checkout on the path; its exit
    code is ours."""
    import subprocess

    from infra.libero_venv import ROOT

    venv = LeRobotVenv.at(cache_root)
    if not venv.ready():
        fail(LeRobotSetupError(f"LeRobot is not set up at {venv.root}: run `sepa-eval lerobot setup`"))
    code = subprocess.call([str(venv.python), "-m", f"producers.learned.{module}", *args], env=venv.environ(ROOT),
                           cwd=ROOT)
    raise typer.Exit(code)


@lerobot_app.command()
def train(dataset: Path = typer.Option(..., help="a LeRobot dataset (export-episodes --model oracle --format lerobot)"),
          output: Path = typer.Option(..., help="where the trained policy goes"),
          cameras: str = typer.Option("agentview,robot0_eye_in_hand", help="the dataset's cameras it sees"),
          episodes: int | None = typer.Option(None, min=1, help="N demonstrations, taken in turn from every task "
                                                                 "(default: all)"),
          steps: int = typer.Option(2000, min=1), batch: int = typer.Option(32, min=1),
          chunk: int = typer.Option(8, min=1, help="actions per request"), seed: int = typer.Option(0),
          words: bool = typer.Option(True, help="read the instruction (--no-words for one task)"),
          cache_root: Path | None = typer.Option(None)):
    """Train a pixel policy by behaviour cloning on a LeRobot dataset, in the LeRobot venv
    (producers/learned/train.py)."""
    args = ["--dataset", str(dataset), "--output", str(output), "--cameras", cameras, "--steps", str(steps),
            "--batch", str(batch), "--chunk", str(chunk), "--seed", str(seed)]
    args += (["--episodes", str(episodes)] if episodes else []) + ([] if words else ["--no-words"])
    _in_venv("train", args, cache_root)


@lerobot_app.command()
def serve(policy: Path = typer.Option(..., help="a trained policy's directory"),
          host: str = typer.Option("127.0.0.1"), port: int = typer.Option(0, min=0, max=65535, help="0: a free one"),
          cache_root: Path | None = typer.Option(None)):
    """Serve a trained policy over openpi's protocol (producers/learned/server.py) until interrupted;
    register it in models.yaml as kind websocket with the uri it prints."""
    _in_venv("server", ["--policy", str(policy), "--host", host, "--port", str(port)], cache_root)
