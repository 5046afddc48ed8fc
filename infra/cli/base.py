"""The Typer app every command registers on, its global options, and what command modules share:
the settings and codec of the edge (``settings_of``, ``codec_of``), the consoles, one-line errors.

Apart from the package's __init__ (which imports the command modules to register them) so that
the command modules import this and not the package that imports them.
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from infra.exceptions import OutOfSpace
from infra.kafka_clients import make_codec, make_producer
from infra.settings import Settings, load_settings
from producers.publisher import Publisher
from schemas.codec import Codec

app = typer.Typer(help="SEPA-Eval: a robot-policy benchmark that gets harder by itself.",
                  no_args_is_help=True, pretty_exceptions_enable=False,
                  # Usage errors in rich's boxes wrap at the terminal's width: plain text off a terminal.
                  rich_markup_mode="rich" if sys.stderr.isatty() else None)
console = Console(soft_wrap=True)
# Errors are read by people and grepped by scripts: never wrapped at the terminal's width (rich
# wraps at 80 columns when stderr is not a terminal) and, off a terminal, never styled.
err = Console(stderr=True, soft_wrap=True, highlight=False)


@app.callback()
def main(ctx: typer.Context,
         memory_dir: Path | None = typer.Option(None, "--memory-dir", help="default ./eval_memory or SEPA_MEMORY_DIR"),
         config: Path | None = typer.Option(None, "--config", help="TOML settings file (or SEPA_CONFIG)")):
    try:
        settings = load_settings(config_file=config, memory_dir=memory_dir)
    except (ValueError, FileNotFoundError) as exc:
        err.print(f"[red]bad configuration:[/red] {escape(_one_line(exc))}")
        raise typer.Exit(2) from exc
    ctx.obj = Edge(settings)


class Edge:
    """What a command builds from the settings, once per process."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._codec: Codec | None = None

    @property
    def codec(self) -> Codec:
        if self._codec is None:
            self._codec = make_codec(self.settings)
        return self._codec


def settings_of(ctx: typer.Context) -> Settings:
    return ctx.obj.settings


def codec_of(ctx: typer.Context) -> Codec:
    return ctx.obj.codec


def republished_line(counts: dict[str, int]) -> str:
    return ("the new embedded broker got what the evidence log holds in flight: "
            + ", ".join(f"{n} on {topic}" for topic, n in counts.items()))


def make_publisher(settings: Settings, bootstrap: str, codec: Codec) -> Publisher:
    return Publisher(make_producer(bootstrap), settings.topic_prefix, codec)


def fail(exc: Exception, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {escape(str(named(exc)))}")
    raise typer.Exit(code)


def named(exc: Exception) -> Exception:
    """An OSError ENOSPC met anywhere (a log, the report, a staging file) reads as what it is, "out of
    disk space", the words `run`'s waits and `why_stopped` use, so one phrase names the cause."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        where = f" writing {exc.filename}" if exc.filename else ""
        return OutOfSpace(f"out of disk space{where} ({exc.strerror})")
    return exc


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
