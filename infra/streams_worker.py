"""The streams worker's edge: settings -> StreamsConfig (infra/streams_config.py) -> make_app, for faust's command line.

    python -m faust -A infra.streams_worker worker --without-web -l info    # what `sepa-eval up` runs

``app`` (what ``-A infra.streams_worker`` looks up) is built on first access from
``infra.settings.load_settings()`` (SEPA_* variables, the config file) and the broker it names
(``SEPA_BOOTSTRAP_SERVERS``, or the embedded broker `sepa-eval up` started). The codec is built here,
once (a Schema Registry's ids when ``schema_registry_url`` is set), and passed to ``make_app``, as
is the cluster-summary model (``llm_summarizer``). Importing this module reads nothing.

faust's web server: faust's ``worker`` command defaults to ``--with-web``, which overrides an app's
``web_enabled=False`` and binds 0.0.0.0:6066, so a second worker on the host dies and the port is
open to the network. Here the settings decide whatever the command line says: off unless
``streams_web`` is set; on, it binds 127.0.0.1 on ``streams_web_port`` (0 = a free port).

Readiness: when its first rebalance has completed (the worker is subscribed and holds its
partitions) the worker writes ``<run_dir>/ready/streams-<pid>.json`` (with the web server's URL
when it runs); `sepa-eval up` waits for that file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import faust
from confluent_kafka import Consumer

from infra.aiokafka_holes import read_contiguously
from infra.kafka_clients import make_consumer
from infra.settings import Settings
from infra.streams_config import llm_summarizer, streams_config
from schemas.codec import Codec
from streams.app import make_app

WEB_BIND = "127.0.0.1"


def ready_path(settings: Settings, pid: int) -> Path:
    return settings.run_dir / "ready" / f"streams-{pid}.json"


def build_app(settings: Settings, bootstrap_servers: str, codec: Codec, ready_file: Path | None = None,
              **overrides) -> faust.App:
    """The worker's app: make_app with this codec and the settings' summary model, faust's web
    server as the settings say (whatever faust's command line says), and a ready file."""
    config = streams_config(settings, bootstrap_servers, **overrides)
    read_contiguously()  # faust's consumer too: the embedded broker can show a batch's successors first

    def consumer_factory(extra: dict) -> Consumer:  # the clusterer's restore reads failures.clusters with it
        return make_consumer(bootstrap_servers, f"{config.app_id}-clusterer-restore", settings.session_timeout_ms,
                             **extra)

    def store_factory():  # the mutator, the gate and the sweeper read the log: through the pipeline when it owns it
        from infra.processes import open_store

        return open_store(settings)

    feasibility = None
    if config.run_mutator:
        # The simulator is imported here, at the edge: imported later, inside the worker, robosuite's
        # logging asks faust's stdout proxy for a file number it does not have.
        from infra.libero_feasibility import scenario_feasibility
        from producers.sim.feasibility import check_feasibility

        feasibility = scenario_feasibility(check_feasibility)  # LIBERO candidates: in the LIBERO venv
    app = make_app(config, llm=llm_summarizer(settings) if config.run_clusterer else None, codec=codec,
                   consumer_factory=consumer_factory, store_factory=store_factory, feasibility=feasibility)
    # The boot strategy's choice wins over conf.web_enabled, which `faust worker` sets from --with-web.
    app.boot_strategy.enable_web = settings.streams_web
    app.conf.web_bind = WEB_BIND
    app.conf.web_host = WEB_BIND
    if settings.streams_web:
        from infra.embedded_broker import free_port

        app.conf.web_port = settings.streams_web_port or free_port()
        app.conf.canonical_url = f"http://{WEB_BIND}:{app.conf.web_port}"
    if ready_file is not None:
        _write_ready_file_on_first_rebalance(app, ready_file, settings.streams_web)
    return app


def _write_ready_file_on_first_rebalance(app: faust.App, path: Path, web: bool) -> None:
    written = False

    async def on_rebalance_complete(sender, **kwargs) -> None:
        nonlocal written
        if written:
            return
        written = True
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(),
                                   "web": f"http://{WEB_BIND}:{app.conf.web_port}" if web else None}))
        tmp.replace(path)

    app.on_rebalance_complete.connect(on_rebalance_complete, weak=False)


def app_from_environment() -> faust.App:
    """The edge: settings from the environment / config file, the broker resolved like the CLI does."""
    from infra.kafka_clients import make_codec
    from infra.processes import resolve_bootstrap
    from infra.settings import load_settings

    settings = load_settings()
    return build_app(settings, resolve_bootstrap(settings), make_codec(settings), ready_path(settings, os.getpid()))


_app: faust.App | None = None


def __getattr__(name: str):
    """``infra.streams_worker.app`` is built on first access (``faust -A infra.streams_worker`` asks for it)."""
    global _app
    if name == "app":
        if _app is None:
            _app = app_from_environment()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
