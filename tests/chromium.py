"""Headless Chromium for tests, driven over the DevTools protocol (a websocket).

`render(url)` loads a page and returns what its console said (exceptions, console.error, log
entries of level error such as a refused or failed load) and a screenshot of an element.
Chromium comes from Debian's `chromium` package (.ci/run installs it).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from PIL import Image
from websockets.sync.client import connect

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-port=0")
START_TIMEOUT_S = 30.0
LOAD_TIMEOUT_S = 30.0
SETTLE_S = 0.5  # after the load event, late console messages still arrive


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Rendered:
    errors: list[str]
    screenshot: Image.Image | None  # of the element asked for (None if it is not on the page)
    element_box: dict | None


class _Session:
    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=LOAD_TIMEOUT_S))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {method} within {timeout}s")
            self.events.append(json.loads(self.ws.recv(timeout=remaining)))

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                self.events.append(json.loads(self.ws.recv(timeout=remaining)))
            except TimeoutError:
                return


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            out.append("exception: " + str(details.get("exception", {}).get("description") or details.get("text")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            out.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            out.append(f"load failed: {params.get('errorText')}")
    return out


def render(url: str, selector: str, width: int = 1280, height: int = 1600) -> Rendered:
    binary = chromium_binary()
    if binary is None:
        raise RuntimeError("chromium is not installed (Debian package `chromium`)")
    # Chromium puts its singleton socket in TMPDIR and aborts when that path passes the 108-byte
    # limit of a unix socket's address: a CI's long TMPDIR did. The profile goes there as well.
    short_tmp = "/tmp" if os.access("/tmp", os.W_OK) else tempfile.gettempdir()
    profile = Path(tempfile.mkdtemp(prefix="sepa-chromium-", dir=short_tmp))
    log = (profile / "chromium.log").open("wb")
    process = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
                               env={**os.environ, "TMPDIR": short_tmp})
    try:
        port = _devtools_port(profile, process)
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t.get("type") == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as ws:
            session = _Session(ws)
            for domain in ("Runtime", "Log", "Page", "Network"):
                session.call(f"{domain}.enable")
            session.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                         mobile=False)
            session.events.clear()
            session.call("Page.navigate", url=url)
            session.wait_for("Page.loadEventFired", LOAD_TIMEOUT_S)
            session.drain(SETTLE_S)
            box = session.call("Runtime.evaluate", returnByValue=True, expression=(
                f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                " e.scrollIntoView(); const r = e.getBoundingClientRect();"
                " return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height};"
                " })()"))["result"].get("value")
            shot = None
            if box and box["width"] > 0 and box["height"] > 0:
                data = session.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                                    clip={**box, "scale": 1})["data"]
                shot = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
            session.drain(0.1)
            return Rendered(_errors(session.events), shot, box)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()
        shutil.rmtree(profile, ignore_errors=True)


def _devtools_port(profile: Path, process: subprocess.Popen) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = (profile / "chromium.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"chromium exited with code {process.returncode} at start: {' | '.join(tail)}")
        if marker.exists():
            lines = marker.read_text().splitlines()
            if lines and lines[0].strip().isdigit():
                return int(lines[0])
        time.sleep(0.1)
    raise TimeoutError(f"chromium did not open its DevTools port within {START_TIMEOUT_S}s")
