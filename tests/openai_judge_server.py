"""A small OpenAI-compatible vision judge on 127.0.0.1 for tests: judges well, or misbehaves on demand.

    with OpenAIJudgeServer(task="lift the red cube", model="judge-vl") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        server.behaviour = "good"                  # or any name in BEHAVIOURS, for every request
        server.overrides["blank_control"] = "timeout"   # or per role of the request
        ...
        server.requests      # JudgeRequest per POST: role, task, image sha256s and sizes, body, reply bytes

A request's role is read the way a test can trust: "blank_control" when every image is one uniform
colour, "unrelated_control" when the prompt's ``Task:`` line is not the server's task, else
"judgment". A good judge scores a judgment ``score`` and a control ``control_score``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

from PIL import Image

_TASK_LINE = re.compile(r"^Task: (.*)$", re.M)


def _verdict(score, completed=None, **extra) -> dict:
    obj = {"observation": "a Panda arm over a table with a red cube; the cube rises between the frames",
           "score": score, "reason": "judged from the frames"}
    if completed is not None:
        obj["task_completed"] = completed
    return obj | extra


# Each behaviour: (score, completed, control score, is a control) -> (content, finish_reason, message extras, model)
# where model None keeps the requested one and "-" drops the field.
BEHAVIOURS = {
    "good": lambda s, ok: (json.dumps(_verdict(s, ok)), "stop", {}, None),
    "no_boolean": lambda s, ok: (json.dumps(_verdict(s)), "stop", {}, None),
    "fenced": lambda s, ok: ("```json\n" + json.dumps(_verdict(s, ok), indent=1) + "\n```", "stop", {}, None),
    "prose": lambda s, ok: ("Here is my verdict: " + json.dumps(_verdict(s, ok)), "stop", {}, None),
    "trailing": lambda s, ok: (json.dumps(_verdict(s, ok)) + "\nHope this helps!", "stop", {}, None),
    "fence_with_prose": lambda s, ok: ("Sure.\n```json\n" + json.dumps(_verdict(s, ok)) + "\n```", "stop", {}, None),
    "two_fences": lambda s, ok: ("```json\n" + json.dumps(_verdict(s, ok)) + "\n```\n```json\n"
                                 + json.dumps(_verdict(s, ok)) + "\n```", "stop", {}, None),
    "partial_fence": lambda s, ok: ("```json\n" + json.dumps(_verdict(s, ok)), "stop", {}, None),
    "malformed": lambda s, ok: ('{"observation": "a cube", "score": 0.9, "reason": ', "stop", {}, None),
    "duplicate_keys": lambda s, ok: ('{"observation": "a cube", "score": 0.1, "reason": "r", "score": 0.95}',
                                     "stop", {}, None),
    "non_numeric_score": lambda s, ok: (json.dumps(_verdict(str(s), ok)), "stop", {}, None),
    "bool_score": lambda s, ok: (json.dumps(_verdict(True, ok)), "stop", {}, None),
    "string_boolean": lambda s, ok: (json.dumps(_verdict(s, "true")), "stop", {}, None),
    "out_of_range": lambda s, ok: (json.dumps(_verdict(1.2, ok)), "stop", {}, None),
    "nan_score": lambda s, ok: ('{"observation": "a cube", "score": NaN, "reason": "r"}', "stop", {}, None),
    "missing_key": lambda s, ok: (json.dumps({"observation": "a cube", "score": s}), "stop", {}, None),
    "extra_key": lambda s, ok: (json.dumps(_verdict(s, ok, confidence=0.9)), "stop", {}, None),
    "array": lambda s, ok: (json.dumps([_verdict(s, ok)]), "stop", {}, None),
    "empty": lambda s, ok: ("", "stop", {}, None),
    "refusal": lambda s, ok: (None, "stop", {"refusal": "I can't help with judging this image."}, None),
    "length": lambda s, ok: (json.dumps(_verdict(s, ok))[:40], "length", {}, None),
    "content_filter": lambda s, ok: (None, "content_filter", {}, None),
    "no_finish_reason": lambda s, ok: (json.dumps(_verdict(s, ok)), None, {}, None),
    "wrong_model": lambda s, ok: (json.dumps(_verdict(s, ok)), "stop", {}, "other-judge-2"),
    "no_model": lambda s, ok: (json.dumps(_verdict(s, ok)), "stop", {}, "-"),
}
SPECIAL = ("timeout", "http_500", "garbage_body", "pass_controls")  # answered outside BEHAVIOURS


@dataclass
class JudgeRequest:
    role: str
    task: str | None
    text: str
    system: str
    images: list[dict]  # {sha256, width, height, uniform}
    body: dict
    headers: dict
    reply: bytes = b""  # the exact HTTP body answered
    behaviour: str = ""
    extra: dict = field(default_factory=dict)


class OpenAIJudgeServer:
    def __init__(self, task: str, model: str = "judge-vl", behaviour: str = "good", score: float = 0.92,
                 control_score: float = 0.05, delay_s: float = 3.0):
        self.task = task
        self.model = model
        self.behaviour = behaviour
        self.overrides: dict[str, str] = {}  # role -> behaviour
        self.score = score
        self.control_score = control_score
        self.delay_s = delay_s  # how long "timeout" keeps the client waiting
        self.requests: list[JudgeRequest] = []
        self._closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/chat/completions":
                    return self._answer(404, json.dumps({"error": {"message": f"no route {self.path}"}}).encode())
                body = json.loads(raw or b"{}")
                request = server._parse(body, {k.lower(): v for k, v in self.headers.items()})
                server.requests.append(request)
                status, reply = server._respond(request)
                if status is None:  # timeout: keep the client waiting, then give up quietly
                    server._closing.wait(server.delay_s)
                    return
                request.reply = reply
                self._answer(status, reply)

            def _answer(self, status: int, data: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("x-request-id", f"req-{len(server.requests)}")
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def roles(self) -> list[str]:
        return [r.role for r in self.requests]

    def _parse(self, body: dict, headers: dict) -> JudgeRequest:
        system, text, images = "", "", []
        for message in body.get("messages", []):
            content = message.get("content")
            if message.get("role") == "system":
                system = content
                continue
            for part in content if isinstance(content, list) else [{"type": "text", "text": content}]:
                if part.get("type") == "text":
                    text += part["text"]
                elif part.get("type") == "image_url":
                    data = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                    with Image.open(io.BytesIO(data)) as img:
                        extrema = img.convert("RGB").getextrema()
                        images.append({"sha256": hashlib.sha256(data).hexdigest(), "width": img.size[0],
                                       "height": img.size[1], "uniform": all(lo == hi for lo, hi in extrema)})
        found = _TASK_LINE.search(text)
        task = json.loads(found.group(1)) if found else None
        if images and all(i["uniform"] for i in images):
            role = "blank_control"
        elif task != self.task:
            role = "unrelated_control"
        else:
            role = "judgment"
        return JudgeRequest(role, task, text, system, images, body, headers)

    def _respond(self, request: JudgeRequest) -> tuple[int | None, bytes]:
        behaviour = self.overrides.get(request.role, self.behaviour)
        request.behaviour = behaviour
        if behaviour == "timeout":
            return None, b""
        if behaviour == "http_500":
            return 500, json.dumps({"error": {"message": "judge overloaded", "type": "server_error"}}).encode()
        if behaviour == "garbage_body":
            return 200, b"<html>502 Bad Gateway</html>"
        control = request.role != "judgment"
        score = self.score if (behaviour == "pass_controls" or not control) else self.control_score
        make = BEHAVIOURS["good" if behaviour == "pass_controls" else behaviour]
        content, finish, extras, model = make(score, score >= 0.8)
        payload = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0,
                   "model": request.body.get("model") if model is None else model,
                   "choices": [{"index": 0, "finish_reason": finish,
                                "message": {"role": "assistant", "content": content} | extras}],
                   "usage": {"prompt_tokens": 900, "completion_tokens": 60, "total_tokens": 960}}
        if model == "-":
            del payload["model"]
        return 200, json.dumps(payload).encode()

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
