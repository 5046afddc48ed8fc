"""A tiny Confluent Schema Registry stand-in (no registry is installable on this machine) that
speaks the two calls of the real REST API we make, with its answers' shapes:

- ``POST /subjects/{subject}/versions`` with ``{"schema": "<json>"}`` -> ``{"id": N}``; ids are
  global: the same schema under any subject gets the same id, a new one the next id;
- ``GET /schemas/ids/{id}`` -> ``{"schema": "<json>"}``, or 404 with ``{"error_code": 40403}``.

Ids start at FIRST_ID, far from the manifest's (1..n), so an event framed with a manifest id is
one this registry does not know.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FIRST_ID = 1001
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class SchemaRegistry:
    def __init__(self):
        self.schemas: dict[int, str] = {}
        self.subjects: dict[str, set[int]] = {}
        self.lock = threading.Lock()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802
                parts = self.path.strip("/").split("/")
                if len(parts) != 3 or parts[0] != "subjects" or parts[2] != "versions":
                    return self._reply(404, {"error_code": 404, "message": f"HTTP 404 Not Found: {self.path}"})
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                return self._reply(200, {"id": registry.register(parts[1], body["schema"])})

            def do_GET(self):  # noqa: N802
                parts = self.path.strip("/").split("/")
                if len(parts) != 3 or parts[:2] != ["schemas", "ids"] or not parts[2].isdigit():
                    return self._reply(404, {"error_code": 404, "message": f"HTTP 404 Not Found: {self.path}"})
                schema = registry.schemas.get(int(parts[2]))
                if schema is None:
                    return self._reply(404, {"error_code": 40403, "message": "Schema not found"})
                return self._reply(200, {"schema": schema})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def register(self, subject: str, schema: str) -> int:
        canonical = json.dumps(json.loads(schema), sort_keys=True)
        with self.lock:
            known = [i for i, s in self.schemas.items() if json.dumps(json.loads(s), sort_keys=True) == canonical]
            schema_id = known[0] if known else FIRST_ID + len(self.schemas)
            self.schemas[schema_id] = self.schemas.get(schema_id, schema)
            self.subjects.setdefault(subject, set()).add(schema_id)
        return schema_id

    def __enter__(self) -> SchemaRegistry:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
