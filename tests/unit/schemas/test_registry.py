"""Schema ids from a Schema Registry. The registry here is a minimal local HTTP double of the
two Confluent endpoints we call (no registry is installable on this machine)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from consumers.evidence.sink import Accepted, triage
from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.events import make_event
from schemas.exceptions import UnknownSchemaId
from schemas.registry import RegistrySchemaIds


class _Registry(BaseHTTPRequestHandler):
    schemas: dict[int, str] = {}

    def log_message(self, *args):
        pass

    def _reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802
        schema = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["schema"]
        for schema_id, known in self.schemas.items():
            if known == schema:
                return self._reply(200, {"id": schema_id})
        schema_id = 100 + len(self.schemas)
        self.schemas[schema_id] = schema
        return self._reply(200, {"id": schema_id})

    def do_GET(self):  # noqa: N802
        schema_id = int(self.path.rsplit("/", 1)[1])
        if schema_id not in self.schemas:
            return self._reply(404, {"error_code": 40403, "message": "Schema not found"})
        return self._reply(200, {"schema": self.schemas[schema_id]})


@pytest.fixture
def registry_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("R", (_Registry,), {"schemas": {}}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _promoted():
    return make_event("Promoted", ("s",), "gate", "r", scenario_id="s", reason="ok", evidence_event_ids=[],
                      gate_version="1")


def test_ids_come_from_the_registry_and_a_fresh_reader_resolves_them(registry_url):
    data = Codec(RegistrySchemaIds(registry_url)).encode(_promoted())
    assert int.from_bytes(data[1:5], "big") == 100
    reader = RegistrySchemaIds(registry_url)
    assert Codec(reader).decode(data)["scenario_id"] == "s"
    assert isinstance(triage(data, BY_NAME["benchmark.decisions"], reader), Accepted)


def test_an_id_the_registry_does_not_know_is_named(registry_url):
    with pytest.raises(UnknownSchemaId, match="schema id 4242"):
        RegistrySchemaIds(registry_url).by_id(4242)
