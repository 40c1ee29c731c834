"""Headless Chromium driven over the DevTools protocol (a WebSocket): open a page, wait for what
it should show, collect console errors and uncaught exceptions, take a screenshot.

Chromium comes from Debian's `chromium` package (scripts/setup.sh installs it). A missing browser
fails the test with that message: the browser test is part of the default suite."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from websockets.sync.client import connect

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str:
    for name in (os.environ.get("TRYLOOP_CHROMIUM"), *CANDIDATES):
        if name and (path := shutil.which(name)):
            return path
    raise AssertionError("no Chromium found (chromium, chromium-browser or $TRYLOOP_CHROMIUM): "
                         "install Debian's `chromium` package (scripts/setup.sh does)")


class Page:
    """One tab over a CDP session; `errors` collects console errors and uncaught exceptions."""

    def __init__(self, ws, session: str):
        self.ws, self.session, self._id = ws, session, 0
        self.errors: list[str] = []
        self.console: list[str] = []

    def _handle(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.errors.append(f"uncaught: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append(f"{params['type']}: {text}")
            if params["type"] in ("error", "assert"):
                self.errors.append(f"console.{params['type']}: {text}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            e = params["entry"]
            self.errors.append(f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip())

    def send(self, method: str, timeout_s: float = 30.0, **params) -> dict:
        self._id += 1
        mid = self._id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params, "sessionId": self.session}))
        deadline = time.monotonic() + timeout_s
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._handle(msg)

    def pump(self, seconds: float) -> None:
        """Take in events for `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._handle(json.loads(self.ws.recv(timeout=left)))
            except TimeoutError:
                return

    def evaluate(self, expression: str):
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise AssertionError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0):
        """Poll a JS expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            self.pump(0.1)
        raise AssertionError(f"timed out waiting for {expression}; errors: {self.errors}; "
                             f"console: {self.console[-5:]}")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def screenshot(self, path: Path, full_page: bool = True) -> None:
        params: dict = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))


@contextlib.contextmanager
def browser_page(width: int = 1400, height: int = 1000) -> Iterator[Page]:
    """A fresh headless Chromium with one page; closed (and its profile removed) on exit."""
    profile = tempfile.mkdtemp(prefix="tryloop-chromium-")
    proc = subprocess.Popen([chromium_path(), "--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                             "--disable-extensions", "--disable-background-networking", "--hide-scrollbars",
                             f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             f"--window-size={width},{height}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url, seen = None, []
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            if m := re.search(r"DevTools listening on (ws://\S+)", line):
                url = m.group(1)
        if url is None:
            raise AssertionError(f"Chromium did not start: {''.join(seen)[-2000:]}")
        # Keep reading its stderr, so that a chatty browser never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
        with connect(url, max_size=64 << 20, open_timeout=30) as ws:
            ws.send(json.dumps({"id": 1, "method": "Target.createTarget", "params": {"url": "about:blank"}}))
            target = next(m for m in iter(lambda: json.loads(ws.recv(timeout=30)), None) if m.get("id") == 1)
            ws.send(json.dumps({"id": 2, "method": "Target.attachToTarget",
                                "params": {"targetId": target["result"]["targetId"], "flatten": True}}))
            attached = next(m for m in iter(lambda: json.loads(ws.recv(timeout=30)), None) if m.get("id") == 2)
            page = Page(ws, attached["result"]["sessionId"])
            page._id = 10
            for domain in ("Page", "Runtime", "Log"):
                page.send(f"{domain}.enable")
            page.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                      mobile=False)
            yield page
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
