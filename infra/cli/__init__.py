"""The `sepa-eval` command line.

Usage:
    sepa-eval up                 # embedded broker, pipeline, streams and rollout workers in the background
    sepa-eval run                # the whole loop, on the embedded default
    sepa-eval status [--json]    # processes, topics and evidence counts
    sepa-eval synth --episodes 100 --steps 200 --seed 7
    sepa-eval replay --verify    # rebuild the store from the topics; exit 1 if the state differs
    sepa-eval replay --republish # store -> topics (the embedded broker forgets on restart)
    sepa-eval report --output eval_memory/report.md
    sepa-eval down

Global options come before the command: `sepa-eval --memory-dir /tmp/m status`.

The commands live by area: stack.py (up, down, status, topics), events.py (synth, sink, replay,
sync-models, rollout, rollout-worker), loop.py (run), read.py (report). Each command builds what
it needs from the settings here, at the edge; command functions do not call each other.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from infra.kafka_clients import make_producer
from infra.settings import Settings, load_settings
from producers.publisher import Publisher
from schemas.codec import Codec
from schemas.registry import schema_ids_for

app = typer.Typer(help="SEPA-Eval: a robot-policy benchmark that gets harder by itself.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()
# Errors are read by people and grepped by scripts: never wrapped at the terminal's width (rich
# wraps at 80 columns when stderr is not a terminal) and, off a terminal, never styled.
err = Console(stderr=True, soft_wrap=True, highlight=False)


@app.callback()
def main(ctx: typer.Context,
         memory_dir: Path | None = typer.Option(None, "--memory-dir", help="default ./eval_memory or SEPA_MEMORY_DIR"),
         config: Path | None = typer.Option(None, "--config", help="TOML settings file (or SEPA_CONFIG)")):
    try:
        ctx.obj = load_settings(config_file=config, memory_dir=memory_dir)
    except (ValueError, FileNotFoundError) as exc:
        err.print(f"[red]bad configuration:[/red] {exc}")
        raise typer.Exit(2) from exc


def _publisher(settings: Settings, bootstrap: str) -> Publisher:
    codec = Codec(schema_ids_for(settings.schema_registry_url))
    return Publisher(make_producer(bootstrap), settings.topic_prefix, codec)


def _fail(exc: Exception) -> None:
    err.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(1)


def settings_of(ctx: typer.Context) -> Settings:
    return ctx.obj


def make_publisher(settings: Settings, bootstrap: str) -> Publisher:
    codec = Codec(schema_ids_for(settings.schema_registry_url))
    return Publisher(make_producer(bootstrap), settings.topic_prefix, codec)


def fail(exc: Exception) -> None:
    err.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(1)


from infra.cli import events, libero, loop, read, stack  # noqa: E402,F401  (registers the commands)
