"""A tiny OpenAI-compatible chat server on 127.0.0.1 for tests: answers POST /v1/chat/completions
with a fixed reply (or a fixed HTTP error) and records what it was asked.

    with OpenAIStub(reply="Cubes slip.") as stub:
        client = openai.OpenAI(base_url=stub.base_url, api_key="test")
        ...
        stub.requests   # [(headers with lower-case names, json body), ...]
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class OpenAIStub:
    def __init__(self, reply: str = "", status: int = 200):
        self.reply = reply
        self.status = status  # anything but 200 answers with an OpenAI-style error body
        self.requests: list[tuple[dict, dict]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                stub.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                if self.path != "/v1/chat/completions":
                    return self._answer(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                if stub.status != 200:
                    return self._answer(stub.status, {"error": {"message": "stub failure", "type": "server_error"}})
                return self._answer(200, {
                    "id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": stub.reply}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()
