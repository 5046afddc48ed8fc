"""The faust-streaming application: failure detection and failure clustering.

    app = make_app(StreamsConfig(bootstrap_servers="127.0.0.1:9092"), codec=codec)

``make_app`` builds an app from a frozen ``StreamsConfig``, the codec that frames every event and
an optional cluster-summary model, and reads nothing else: no settings, no environment. The
process entry point (settings -> StreamsConfig -> make_app, the codec, the LLM client, the
processing-guarantee check, faust's web server) is the edge, ``infra/streams_worker.py``:

    python -m faust -A infra.streams_worker worker --without-web -l info

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
from dataclasses import dataclass, field, replace
from pathlib import Path

import faust

from schemas.catalog import BY_NAME, MAX_MESSAGE_BYTES
from schemas.codec import Codec
from streams.exceptions import ConfigError
from streams.failures.agents import Batching, register_clusterer, register_detector
from streams.failures.clusterer import ClustererConfig, OnlineFailureClusterer
from streams.failures.collector import ClusterStage, CollectorConfig
from streams.failures.detector import DetectorConfig
from streams.failures.embedding import EmbeddingConfig
from streams.failures.router import DetectorStage, RouterConfig
from streams.failures.summaries import FeatureDescriber, LlmSummarizer
from streams.gate.agent import GateRunner, register_gate
from streams.gate.gate import GateConfig, PromotionGate
from streams.gate.sweeps import SweeperConfig, SweepRunner, register_sweeper
from streams.mutations.agent import MutatorConfig, MutatorRunner, register_mutator
from streams.mutations.settled_clusters import SettledClustering

GUARANTEES = ("at_least_once", "exactly_once")
# Why exactly_once is refused (the module docstring has the details).
EXACTLY_ONCE_REFUSED = ("exactly_once is refused: with faust-streaming 0.15.3 the failure moments would sit in Kafka "
                        "transactions that never commit (outputs join the transaction of the output partition's "
                        "topic group, see streams/app.py), and the embedded Tansu broker refuses aiokafka's "
                        "InitProducerId v0. Use at_least_once: restarts are lossless and re-emitted moments keep "
                        "their event ids, which the evidence log counts once")


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
    # The evolving loop's agents read the evidence log (make_app needs a store_factory for them);
    # the streams worker `sepa-eval up` starts runs all three (infra/streams_worker.py).
    run_mutator: bool = False  # answers evolution cycles (benchmark.cycles: one partition, one mutator at a time)
    run_gate: bool = False  # decides candidates (the worker holding benchmark.decisions' partition)
    run_sweeper: bool = False  # sweeps a newly registered model version (models.registry: one partition)
    gate: GateConfig = field(default_factory=GateConfig)
    sweeper: SweeperConfig = field(default_factory=SweeperConfig)
    mutator: MutatorConfig = field(default_factory=MutatorConfig)
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


def _raw_topic(app: faust.App, *names: str):
    return app.topic(*names, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


def make_app(config: StreamsConfig, llm: LlmSummarizer | None = None, codec: Codec | None = None,
             consumer_factory: Callable[[dict], object] | None = None,
             store_factory: Callable[[], object] | None = None, feasibility: Callable | None = None) -> faust.App:
    """A faust app running the agents ``config`` enables. ``codec`` frames and reads every event
    (the manifest's schema ids when None; the edge passes the one it built, with a Schema
    Registry's ids when one is configured). ``llm`` (optional) rewrites cluster summaries with a
    language model; ``consumer_factory(extra settings)`` returns a confluent_kafka Consumer for the
    broker (the clusterer's restore reads its log with it; needed when it runs); ``store_factory()``
    opens the evidence store (the mutator, the gate and the sweeper read the log through it; needed
    when they run); ``feasibility(spec)`` is the mutator's pre-check (producers.sim.feasibility: the caller
    imports the simulator, before faust takes over the process's stdout). All are built by the
    caller, never from the environment (an LLM paraphraser comes inside ``config.mutator``)."""
    if config.run_clusterer and consumer_factory is None:
        raise ConfigError("make_app: the clusterer restores itself from failures.clusters and needs a "
                          "consumer_factory (extra settings -> confluent_kafka Consumer), built at the edge")
    if (config.run_mutator or config.run_gate or config.run_sweeper) and store_factory is None:
        raise ConfigError("make_app: the mutator, the gate and the sweeper read the evidence log and need a "
                          "store_factory (-> EvidenceStore), built at the edge")
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
        producer_max_request_size=MAX_MESSAGE_BYTES,  # what every topic takes (schemas/catalog.py)
        store="memory://",
        autodiscover=False,
    )
    prefix = config.topic_prefix
    codec = codec or Codec()
    batching = Batching(config.batch_max, config.batch_within_s, config.tick_interval_s, config.stats_interval_s)

    def full(name: str) -> str:
        return BY_NAME[name].full_name(prefix)

    outputs = {name: _raw_topic(app, full(name))
               for name in ("failures.moments", "failures.episodes", "failures.clusters", "deadletter",
                            "scenarios.candidates", "benchmark.cycles", "benchmark.decisions", "rollout.requests")}
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
    if config.run_mutator:
        # the mutator re-runs the worker's own clusterer over each cycle's failures (settled_clusters.py)
        mutator = replace(config.mutator, clustering=SettledClustering(config.clusterer, config.embedding))
        runner = MutatorRunner(store_factory, codec, mutator, check=feasibility)
        register_mutator(app, _raw_topic(app, full("benchmark.cycles")), outputs, runner)
        app.mutator = runner
    if config.run_gate:
        gate = GateRunner(store_factory, codec, PromotionGate(config.gate), topic_prefix=prefix, run_id=config.run_id)
        register_gate(app, _raw_topic(app, full("benchmark.decisions")), _raw_topic(app, full("critics.verdicts")),
                      outputs, gate, config.tick_interval_s, prefix)
        app.gate = gate
    if config.run_sweeper:
        sweeper = SweepRunner(store_factory, codec, config.sweeper, topic_prefix=prefix)
        register_sweeper(app, _raw_topic(app, full("models.registry")), outputs, sweeper)
        app.sweeper = sweeper
    return app
