"""The faust-streaming application: failure detection and failure clustering.

    faust -A streams.app worker -l info          # the edge: settings from SEPA_* / --config file

    app = make_app(StreamsConfig(bootstrap_servers="127.0.0.1:9092"))   # in code and tests

``make_app`` builds an app from a frozen ``StreamsConfig`` and reads nothing else. The module
attribute ``app`` (what ``faust -A streams.app`` looks up) is built on first access from
``infra.settings.load_settings()`` (the one place that reads the environment) and the broker it
resolves (``SEPA_BOOTSTRAP_SERVERS``, or the embedded broker started by ``sepa-eval up``); importing
this module alone reads nothing and connects to nothing. With ``SEPA_OPENAI_BASE_URL`` and
``SEPA_OPENAI_MODEL`` set, cluster summaries are rewritten by that OpenAI-compatible model
(``llm_summarizer``); otherwise they are the feature summaries.

Faust settings that matter here (see /work/shared/notes/platform-facts.md):
- ``broker_session_timeout=6``: against Tansu a worker otherwise takes ~30 s to start.
- ``stream_wait_empty=False``: the detector holds back the acknowledgement of open episodes'
  events (streams/failures/agents.py); faust must not wait for them at a rebalance or shutdown.
  It commits what is acknowledged, and the open episodes are read again.
- ``processing_guarantee`` (``SEPA_STREAMS_PROCESSING_GUARANTEE``): "at_least_once", the only
  one accepted. "exactly_once" is refused with the reason: against Tansu it fails at startup
  (aiokafka's InitProducerId v0); against Apache Kafka 4.4 it starts but does not deliver:
  faust-streaming 0.15.3 sends each output in the transaction of the *output* partition's topic
  group, committed only with input offsets of that group, so moments (failures.moments is an
  input of the clusterer, read read_committed) sit in transactions that never commit, and outputs
  to topics no agent reads (failures.clusters, deadletter) bypass transactions altogether. What
  at_least_once gives instead: lossless restarts, and re-emitted moments keep their event ids, so
  the evidence log (which dedups by id) holds each moment once.
- Topics are raw bytes (``value_serializer="raw"``); we decode with schemas.codec ourselves.
  Faust declares no topics (``topic_allow_declare=False``, no leader topic): the catalog's topics
  come from ``infra.kafka_clients.ensure_topics`` with their partition counts.
- The clusterer is global state, made a singleton by partition ownership: it reads only
  failures.episodes (one partition), so of the workers running it (``run_clusterer=True``) the
  one holding that partition is active and the others stand by; a standby that gets the
  partition restores itself from failures.clusters (``consumer_factory``: the edge builds the
  confluent_kafka consumers that read it) and carries on with the same ids. The detector scales
  with rollout partitions: rollout.steps and rollout.episodes are both keyed by episode_id with
  the same partition count, so an episode's events co-locate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import faust

from schemas.catalog import BY_NAME
from schemas.codec import Codec
from streams.exceptions import ConfigError
from streams.failures.agents import Batching, register_clusterer, register_detector
from streams.failures.clusterer import ClustererConfig, OnlineFailureClusterer
from streams.failures.collector import ClusterStage, CollectorConfig
from streams.failures.detector import DetectorConfig
from streams.failures.embedding import EmbeddingConfig
from streams.failures.router import DetectorStage, RouterConfig
from streams.failures.summaries import FeatureDescriber, LlmSummarizer

GUARANTEES = ("at_least_once", "exactly_once")
# Why exactly_once is refused (the module docstring has the details).
EXACTLY_ONCE_REFUSED = ("exactly_once is refused: with faust-streaming 0.15.3 the failure moments would sit in Kafka "
                        "transactions that never commit (outputs join the transaction of the output partition's "
                        "topic group, see streams/app.py), and the embedded Tansu broker refuses aiokafka's "
                        "InitProducerId v0. Use at_least_once: restarts are lossless and re-emitted moments keep "
                        "their event ids, which the evidence log counts once")


def processing_guarantee(settings) -> str:
    """``settings.streams_processing_guarantee``, refused where it cannot work: exactly_once needs
    Kafka transactions, which the embedded Tansu broker does not give aiokafka."""
    guarantee = settings.streams_processing_guarantee
    if guarantee == "exactly_once":
        raise ConfigError(f"streams_processing_guarantee (SEPA_STREAMS_PROCESSING_GUARANTEE): {EXACTLY_ONCE_REFUSED}")
    return guarantee


def llm_summarizer(settings) -> LlmSummarizer | None:
    """The cluster-summary model the settings name (``openai_base_url`` and ``openai_model``), or
    None for feature summaries. Builds the OpenAI client; call it at the edge only."""
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


@dataclass(frozen=True, kw_only=True)
class StreamsConfig:
    bootstrap_servers: str  # host:port[,host:port...]
    topic_prefix: str = "sepa."
    app_id: str = "sepa-streams"  # faust app id = Kafka consumer group
    run_id: str = "streams"  # envelope run_id of the events this app emits
    processing_guarantee: str = "at_least_once"  # or "exactly_once" (Apache Kafka only)
    broker_session_timeout_s: float = 6.0  # Tansu joins a group in ~max(1 s, timeout / 2), s
    data_dir: Path = Path("eval_memory/faust")  # faust's local data directory
    web_enabled: bool = False  # faust's HTTP stats server (port 6066 per worker)
    batch_max: int = 1000  # events per agent batch
    batch_within_s: float = 0.2  # wait at most this long to fill a batch, s
    tick_interval_s: float = 1.0  # time-based work (overdue ends, the clusterer's restore and idle work), s
    stats_interval_s: float = 30.0  # stage counters are logged this often when they changed, s
    run_detector: bool = True
    run_clusterer: bool = True  # in exactly one worker
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    clusterer: ClustererConfig = field(default_factory=ClustererConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or any(not h.strip() for h in self.bootstrap_servers.split(",")):
            raise ConfigError(f"StreamsConfig.bootstrap_servers must be host:port[,host:port], "
                              f"got {self.bootstrap_servers!r}")
        if self.processing_guarantee not in GUARANTEES:
            raise ConfigError(f"StreamsConfig.processing_guarantee must be one of {GUARANTEES}, "
                              f"got {self.processing_guarantee!r}")
        if self.processing_guarantee == "exactly_once":
            raise ConfigError(f"StreamsConfig.processing_guarantee: {EXACTLY_ONCE_REFUSED}")
        if not self.broker_session_timeout_s > 0:
            raise ConfigError(f"StreamsConfig.broker_session_timeout_s must be > 0, "
                              f"got {self.broker_session_timeout_s!r}")
        if not isinstance(self.batch_max, int) or self.batch_max < 1:
            raise ConfigError(f"StreamsConfig.batch_max must be an integer >= 1, got {self.batch_max!r}")
        for name in ("batch_within_s", "tick_interval_s", "stats_interval_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"StreamsConfig.{name} must be > 0, got {getattr(self, name)!r}")

    @classmethod
    def from_settings(cls, settings, bootstrap_servers: str, **overrides) -> StreamsConfig:
        """From the project's Settings (infra.settings) and a resolved broker."""
        return cls(bootstrap_servers=bootstrap_servers, topic_prefix=settings.topic_prefix,
                   processing_guarantee=processing_guarantee(settings),
                   broker_session_timeout_s=settings.session_timeout_ms / 1000.0,
                   data_dir=settings.memory_dir / "faust", **overrides)


def _raw_topic(app: faust.App, *names: str):
    return app.topic(*names, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


def make_app(config: StreamsConfig, llm: LlmSummarizer | None = None,
             consumer_factory: Callable[[dict], object] | None = None) -> faust.App:
    """A faust app running the failure agents ``config`` enables. ``llm`` (optional) rewrites
    cluster summaries with a language model; ``consumer_factory(extra settings)`` returns a
    confluent_kafka Consumer for the broker (the clusterer's restore reads its log with it; needed
    when it runs). Both are built by the caller, never from the environment."""
    if config.run_clusterer and consumer_factory is None:
        raise ConfigError("make_app: the clusterer restores itself from failures.clusters and needs a "
                          "consumer_factory (extra settings -> confluent_kafka Consumer), built at the edge")
    config.data_dir.mkdir(parents=True, exist_ok=True)  # faust does not create its parent
    app = faust.App(
        config.app_id,
        broker=[f"kafka://{h.strip()}" for h in config.bootstrap_servers.split(",")],
        broker_session_timeout=config.broker_session_timeout_s,
        processing_guarantee=config.processing_guarantee,
        stream_wait_empty=False,
        datadir=str(config.data_dir),
        web_enabled=config.web_enabled,
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        store="memory://",
        autodiscover=False,
    )
    prefix = config.topic_prefix
    codec = Codec()
    batching = Batching(config.batch_max, config.batch_within_s, config.tick_interval_s, config.stats_interval_s)

    def full(name: str) -> str:
        return BY_NAME[name].full_name(prefix)

    outputs = {name: _raw_topic(app, full(name))
               for name in ("failures.moments", "failures.episodes", "failures.clusters", "deadletter")}
    if config.run_detector:
        stage = DetectorStage(config.detector, config.router, prefix, config.run_id, codec=codec)
        register_detector(app, _raw_topic(app, full("rollout.steps"), full("rollout.episodes")), outputs, stage,
                          batching)
        app.failure_detector_stage = stage
    if config.run_clusterer:
        clusterer = OnlineFailureClusterer(config.clusterer, FeatureDescriber(config.embedding), config.run_id)
        stage = ClusterStage(clusterer, config.embedding, config.collector, prefix, config.run_id, codec=codec,
                             want_llm_summaries=llm is not None)
        app.failure_clusterer_seat = register_clusterer(app, _raw_topic(app, full("failures.episodes")), outputs,
                                                        stage, batching, consumer_factory, llm)
        app.failure_cluster_stage = stage
    return app


def app_from_environment() -> faust.App:
    """The edge: settings from the environment / config file, broker resolved like the CLI does."""
    from confluent_kafka import Consumer

    from infra.kafka_clients import consumer_config
    from infra.processes import resolve_bootstrap
    from infra.settings import load_settings

    settings = load_settings()
    config = StreamsConfig.from_settings(settings, resolve_bootstrap(settings))

    def consumer_factory(extra: dict) -> Consumer:
        return Consumer(consumer_config(config.bootstrap_servers, f"{config.app_id}-clusterer-restore",
                                        settings.session_timeout_ms, **extra))

    return make_app(config, llm=llm_summarizer(settings) if config.run_clusterer else None,
                    consumer_factory=consumer_factory)


_app: faust.App | None = None


def __getattr__(name: str):
    """``streams.app.app`` is built on first access (``faust -A streams.app`` asks for it)."""
    global _app
    if name == "app":
        if _app is None:
            _app = app_from_environment()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
