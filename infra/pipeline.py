"""The long-running pipeline process that `sepa-eval up` starts in the background.

It owns the evidence store (chDB allows one owner per directory), serves it to the other commands
on a 127.0.0.1 endpoint, and runs the evidence sink. A sink failure is logged and the sink is
restarted from its last committed offsets; nothing committed is lost and nothing is counted twice.

Usage (normally through `sepa-eval up`):
    python -m infra.pipeline <memory-dir>/run/pipeline-settings.json
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path

from confluent_kafka import Consumer

from consumers.evidence.endpoint import serve
from consumers.evidence.sink import GROUP_ID, EvidenceSink
from consumers.evidence.store import ClickHouseStore, migrate
from infra.kafka_clients import consumer_config, make_producer
from infra.settings import Settings
from schemas.codec import Codec
from schemas.registry import schema_ids_for

log = logging.getLogger("sepa.pipeline")
RESTART_BACKOFF_S = 2.0


def run(settings: Settings, stop: threading.Event) -> None:
    store = ClickHouseStore.connect(settings.clickhouse_url, settings.chdb_path, settings.clickhouse_database)
    migrate(store)
    ready: dict = {"store_url": None}
    server = None
    if settings.embedded_store:
        server = serve(store, settings.store_endpoint_port)
        ready["store_url"] = f"http://127.0.0.1:{server.server_port}"
    (settings.run_dir / "pipeline-ready.json").write_text(json.dumps(ready))
    log.info("pipeline ready: %s", ready)
    codec = Codec(schema_ids_for(settings.schema_registry_url))
    try:
        while not stop.is_set():
            consumer = Consumer(consumer_config(settings.bootstrap_servers, GROUP_ID, settings.session_timeout_ms))
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


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings.model_validate_json(Path(argv[0]).read_text())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(settings, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
