"""`sepa-eval lerobot ...`: the venv with LeRobot's own code, which reads (and will train on) our exports.

    sepa-eval lerobot setup [--force]     # build the LeRobot venv (idempotent; 1-2 min, ~5 GB the first time)
    sepa-eval lerobot status              # is it set up, and with which versions
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
