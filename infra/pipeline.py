"""The long-running pipeline process that `sepa-eval up` starts in the background.

It owns the evidence store (chDB allows one owner per directory), serves it to the other commands
on a 127.0.0.1 endpoint, and runs the evidence sink. A sink failure is logged and the sink is
restarted from its last committed offsets; nothing committed is lost and nothing is counted twice.

Settings come from SEPA_* variables (`up` sets them, with the resolved broker), like every other
process of the project. Once the store is open, its endpoint serves and the broker answered, it
writes ``<run_dir>/ready/pipeline-<pid>.json`` (with the endpoint's URL) for `up`.

Usage (normally through `sepa-eval up`):
    SEPA_BOOTSTRAP_SERVERS=127.0.0.1:9092 SEPA_MEMORY_DIR=/abs/eval_memory python -m infra.pipeline
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from consumers.evidence.endpoint import serve
from consumers.evidence.sink import GROUP_ID, EvidenceSink
from consumers.evidence.store import ClickHouseStore, migrate
from infra.kafka_clients import make_codec, make_consumer, make_producer, require_broker
from infra.processes import PIPELINE, write_ready
from infra.settings import Settings, load_settings

log = logging.getLogger("sepa.pipeline")
RESTART_BACKOFF_S = 2.0


def run(settings: Settings, stop: threading.Event) -> None:
    if not settings.bootstrap_servers:
        raise ValueError("the pipeline needs SEPA_BOOTSTRAP_SERVERS (sepa-eval up sets it to the broker it resolved)")
    codec = make_codec(settings)
    store = ClickHouseStore.connect(settings.clickhouse_url, settings.chdb_path, settings.clickhouse_database)
    migrate(store)
    ready: dict = {"store_url": None}
    server = None
    if settings.embedded_store:
        server = serve(store, settings.store_endpoint_port)
        ready["store_url"] = f"http://127.0.0.1:{server.server_port}"
    try:
        require_broker(settings.bootstrap_servers, settings.broker_timeout_s, "SEPA_BOOTSTRAP_SERVERS")
        write_ready(settings, PIPELINE.name, ready)
        log.info("pipeline ready: %s", ready)
        while not stop.is_set():
            consumer = make_consumer(settings.bootstrap_servers, GROUP_ID, settings.session_timeout_ms)
            sink = EvidenceSink(store, consumer, make_producer(settings.bootstrap_servers), codec,
                                settings.topic_prefix, settings.sink_batch_max, settings.sink_linger_ms)
            try:
                totals = sink.run(stop)
                log.info("sink stopped: %s", totals)
            except Exception:
                log.exception("sink failed; restarting from the last committed offsets")
                stop.wait(RESTART_BACKOFF_S)
    finally:
        if server is not None:
            server.shutdown()
        store.close()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = load_settings()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(settings, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
