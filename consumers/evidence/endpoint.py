"""The store owner's local endpoint, and the client other commands use to reach it.

chDB lets one process own a store directory. While the pipeline runs it owns the store, and
`status`, `report`, `replay` reach the same store through this endpoint on 127.0.0.1, with the
same EvidenceStore interface as direct access. JSON with two tags (datetime, bytes) carries
query results exactly; inserts carry the Avro container as the request body.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from consumers.evidence.exceptions import StoreQueryError, StoreUnavailable
from consumers.evidence.store import ClickHouseStore


def _tag(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"$dt": value.isoformat()}
    if isinstance(value, (bytes, bytearray)):
        return {"$b64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _tag(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tag(v) for v in value]
    return value


def _untag(value: Any) -> Any:
    if isinstance(value, dict):
        if value.keys() == {"$dt"}:
            return datetime.fromisoformat(value["$dt"])
        if value.keys() == {"$b64"}:
            return base64.b64decode(value["$b64"])
        return {k: _untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untag(v) for v in value]
    return value


class _Handler(BaseHTTPRequestHandler):
    store: ClickHouseStore  # set on the subclass made by serve()

    def log_message(self, *args) -> None:  # keep the pipeline log for the pipeline
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        url = urllib.parse.urlparse(self.path)
        params = dict(urllib.parse.parse_qsl(url.query))
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        store = self.store.with_database(params.get("database", self.store.database))
        try:
            if url.path == "/insert":
                store.insert_container(params["table"], body)
                result: Any = None
            else:
                request = json.loads(body)
                if url.path == "/query":
                    result = store.query(request["sql"], _untag(request.get("parameters")),
                                         request.get("column_formats"))
                elif url.path == "/command":
                    result = store.command(request["sql"], _untag(request.get("parameters")))
                else:
                    self._reply(404, {"error": f"no such endpoint {url.path}"})
                    return
            self._reply(200, {"result": _tag(result)})
        except StoreQueryError as exc:
            self._reply(400, {"error": str(exc)})
        except Exception as exc:  # a bad request must not take the pipeline down
            self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})

    def do_GET(self) -> None:  # noqa: N802
        self._reply(200, {"ok": True, "database": self.store.database})

    def _reply(self, code: int, payload: dict) -> None:
        data = json.dumps(payload, default=str).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve(store: ClickHouseStore, port: int = 0) -> ThreadingHTTPServer:
    """Start the endpoint on 127.0.0.1 in a daemon thread; returns the server (server_port)."""
    handler = type("StoreHandler", (_Handler,), {"store": store})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, name="store-endpoint", daemon=True).start()
    return server


class RemoteStore:
    """EvidenceStore over the owner's endpoint."""

    def __init__(self, url: str, database: str, timeout: float = 300.0):
        self.url = url.rstrip("/")
        self.database = database
        self.timeout = timeout

    def with_database(self, database: str) -> RemoteStore:
        return RemoteStore(self.url, database, self.timeout)

    def _post(self, path: str, body: bytes, **params: str) -> Any:
        query = urllib.parse.urlencode({"database": self.database, **params})
        request = urllib.request.Request(f"{self.url}{path}?{query}", data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return _untag(json.loads(response.read())["result"])
        except urllib.error.HTTPError as exc:
            detail = json.loads(exc.read() or b"{}").get("error", str(exc))
            raise StoreQueryError(detail) from exc
        except OSError as exc:
            cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(cause, ConnectionRefusedError):
                said = "is not running (nothing listens there)"
            elif isinstance(cause, TimeoutError) or "timed out" in str(cause):
                said = f"did not answer within {self.timeout:g} s"
            else:
                said = f"did not answer ({getattr(cause, 'strerror', None) or cause})"
            raise StoreUnavailable(f"the pipeline process that owns the evidence store ({self.url}) {said}; "
                                   "`sepa-eval up` restarts it") from exc

    def query(self, sql: str, parameters: dict | None = None, column_formats: dict | None = None) -> list[tuple]:
        body = json.dumps({"sql": sql, "parameters": _tag(parameters), "column_formats": column_formats})
        return [tuple(row) for row in self._post("/query", body.encode())]

    def command(self, sql: str, parameters: dict | None = None) -> Any:
        return self._post("/command", json.dumps({"sql": sql, "parameters": _tag(parameters)}).encode())

    def insert_container(self, table: str, container: bytes) -> None:
        self._post("/insert", container, table=table)
