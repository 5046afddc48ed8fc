"""The streams worker's edge: settings -> StreamsConfig -> make_app, for faust's command line.

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

from infra.kafka_clients import consumer_config
from infra.settings import Settings
from schemas.codec import Codec
from streams.app import EXACTLY_ONCE_REFUSED, StreamsConfig, make_app
from streams.exceptions import ConfigError
from streams.failures.collector import CollectorConfig
from streams.failures.summaries import LlmSummarizer
from streams.gate.gate import GateConfig
from streams.gate.sweeps import SweeperConfig
from streams.mutations.agent import MutatorConfig
from streams.mutations.chooser import ChooserConfig
from streams.mutations.operators import LLMParaphraser, OperatorConfig

WEB_BIND = "127.0.0.1"


def processing_guarantee(settings: Settings) -> str:
    """``settings.streams_processing_guarantee``, refused where it cannot work (streams/app.py says why)."""
    guarantee = settings.streams_processing_guarantee
    if guarantee == "exactly_once":
        raise ConfigError(f"streams_processing_guarantee (SEPA_STREAMS_PROCESSING_GUARANTEE): {EXACTLY_ONCE_REFUSED}")
    return guarantee


def llm_summarizer(settings: Settings) -> LlmSummarizer | None:
    """The cluster-summary model the settings name (``openai_base_url`` and ``openai_model``), or
    None for feature summaries. Builds the OpenAI client."""
    if settings.openai_base_url is None and settings.openai_model is None:
        return None
    if not settings.openai_base_url or not settings.openai_model:
        raise ConfigError(f"LLM cluster summaries need both openai_base_url (SEPA_OPENAI_BASE_URL) and "
                          f"openai_model (SEPA_OPENAI_MODEL), got {settings.openai_base_url!r} and "
                          f"{settings.openai_model!r}")
    if settings.openai_api_key is None:
        raise ConfigError(f"LLM cluster summaries from {settings.openai_base_url} need an API key: set "
                          "SEPA_OPENAI_API_KEY or OPENAI_API_KEY (any value for a server that checks none)")
    import openai

    client = openai.OpenAI(base_url=settings.openai_base_url,
                           api_key=settings.openai_api_key.get_secret_value(), max_retries=1)
    return LlmSummarizer(client, model=settings.openai_model)


def check_settings(settings: Settings) -> None:
    """What the worker would refuse at start, for `sepa-eval up` to refuse before starting anything."""
    processing_guarantee(settings)
    llm_summarizer(settings)


def mutator_config(settings: Settings) -> MutatorConfig:
    """The mutator's config: instructions paraphrased by the OpenAI-compatible model the settings
    name (openai_base_url, openai_model), else by the deterministic templates."""
    operators = OperatorConfig()
    if settings.openai_base_url and settings.openai_model and settings.openai_api_key is not None:
        import openai

        client = openai.OpenAI(base_url=settings.openai_base_url,
                               api_key=settings.openai_api_key.get_secret_value(), max_retries=1)
        operators = OperatorConfig(paraphraser=LLMParaphraser(client, settings.openai_model))
    return MutatorConfig(chooser=ChooserConfig(operators=operators))


def gate_config(settings: Settings) -> GateConfig:
    """The promotion gate's config: the one the worker's gate and `sepa-eval promote` decide with
    (the same config gives the same decisions, event for event)."""
    return GateConfig(semantic_required=settings.judge_configured, verdict_timeout_s=settings.gate_verdict_timeout_s)


def served_models(settings: Settings) -> frozenset[str]:
    """The models the rollout workers serve: their registry file's."""
    from producers.sim.models import load_models

    return frozenset(m.model_id for m in load_models(settings.models_file))


def streams_config(settings: Settings, bootstrap_servers: str, **overrides) -> StreamsConfig:
    """The StreamsConfig the settings give, for the broker the edge resolved."""
    values = {"mutator": mutator_config(settings), "run_mutator": True, "run_gate": True, "run_sweeper": True,
              "collector": CollectorConfig(fragile_successes=settings.cluster_fragile_successes),
              "gate": gate_config(settings),
              "sweeper": SweeperConfig(sweep_seeds=settings.sweep_seeds, served_models=served_models(settings)),
              **overrides}
    return StreamsConfig(bootstrap_servers=bootstrap_servers, topic_prefix=settings.topic_prefix,
                         processing_guarantee=processing_guarantee(settings),
                         broker_session_timeout_s=settings.session_timeout_ms / 1000.0,
                         data_dir=settings.memory_dir / "faust", web_enabled=settings.streams_web, **values)


def ready_path(settings: Settings, pid: int) -> Path:
    return settings.run_dir / "ready" / f"streams-{pid}.json"


def build_app(settings: Settings, bootstrap_servers: str, codec: Codec, ready_file: Path | None = None,
              **overrides) -> faust.App:
    """The worker's app: make_app with this codec and the settings' summary model, faust's web
    server as the settings say (whatever faust's command line says), and a ready file."""
    config = streams_config(settings, bootstrap_servers, **overrides)

    def consumer_factory(extra: dict) -> Consumer:  # the clusterer's restore reads failures.clusters with it
        return Consumer(consumer_config(bootstrap_servers, f"{config.app_id}-clusterer-restore",
                                        settings.session_timeout_ms, **extra))

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
