"""A small headless-Chromium driver for the book's browser test, over the DevTools protocol.

It starts the system's ``chromium`` (Debian's package) with ``--remote-debugging-port``, talks to
one page target through ``websocket-client`` (already in the course environment, so no
Selenium or Playwright download is needed), and offers what the test uses: navigate and wait
for the load, evaluate JavaScript, collect console errors and failed requests, take a
screenshot.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket


def find_chromium() -> str | None:
    """The path of a Chromium executable on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_or_skip() -> str:
    """The Chromium executable; without one the calling test is skipped (it fails when
    ``COURSE_REQUIRE_BROWSER`` is set, as in CI)."""
    import os

    import pytest

    executable = find_chromium()
    if executable is None:
        if os.environ.get("COURSE_REQUIRE_BROWSER"):
            pytest.fail("COURSE_REQUIRE_BROWSER is set but chromium is not installed")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return executable


class Browser:
    """One headless Chromium with one tab.

    Use as a context manager. ``errors`` collects console errors, uncaught exceptions and failed
    network requests since the last :meth:`goto`.
    """

    def __init__(self, executable: str, width: int = 1280, height: int = 900) -> None:
        self._profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self._process = subprocess.Popen(
            [
                executable,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--remote-debugging-port=0",
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self._process.poll() is not None:
                self.close()
                raise RuntimeError("Chromium did not start (no DevToolsActivePort)")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.load(r)
        page = next(t for t in targets if t.get("type") == "page")
        self._ws = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True
        )
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []
        self.errors: list[str] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop Chromium and remove its profile."""
        try:
            self._ws.close()
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        shutil.rmtree(self._profile, ignore_errors=True)

    def _record(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.errors.append(f"console.error: {args}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"uncaught exception: {text}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            if entry.get("url", "").endswith("/favicon.ico"):
                # Chromium asks for a site icon on its own, sometimes before the page has
                # told it there is none; that request is the browser's, not the page's.
                self._events.append(event)
                return
            self.errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            self.errors.append(f"request failed: {params.get('errorText')}")
        self._events.append(event)

    def requested_urls(self) -> list[str]:
        """Every URL the page asked for since the last :meth:`goto` (documents, scripts,
        styles, fetches, websockets), in order."""
        urls = []
        for event in self._events:
            params = event.get("params", {})
            if event.get("method") == "Network.requestWillBeSent":
                urls.append(params["request"]["url"])
            elif event.get("method") == "Network.webSocketCreated":
                urls.append(params["url"])
        return urls

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events meanwhile are recorded)."""
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._record(message)

    def _wait_event(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self._events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self._ws.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                self._record(json.loads(self._ws.recv()))
            except websocket.WebSocketTimeoutException:
                pass
        self._ws.settimeout(60)

    def goto(self, url: str, timeout: float = 60) -> None:
        """Open ``url`` and wait for its load event; reset :attr:`errors`."""
        before = self._evaluate_between_pages("location.href", timeout)
        self.errors = []
        self._events = []
        self.send("Page.navigate", url=url)
        self._wait_event("Page.loadEventFired", timeout)
        # A load event of the page before can arrive late: also wait until the document has
        # changed and finished loading (best effort: reopening the same URL keeps its href).
        self.wait_for(
            f"location.href !== {json.dumps(before)} && document.readyState === 'complete'",
            timeout=10,
        )

    def evaluate(self, expression: str, timeout: float = 30) -> Any:
        """The value of a JavaScript expression (promises are awaited)."""
        result = self.send(
            "Runtime.evaluate",
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
            timeout=int(timeout * 1000),
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript error: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    # What Chrome answers when a navigation (a redirect, a late load) replaces the document
    # while an expression is being evaluated in it: try again in the new document.
    _NAVIGATING = ("navigated or closed", "Cannot find context", "context was destroyed")

    def _evaluate_between_pages(self, expression: str, timeout: float) -> Any:
        """:meth:`evaluate`, waiting out navigations (None if one lasts past ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.evaluate(expression)
            except RuntimeError as err:
                if not any(t in str(err) for t in self._NAVIGATING):
                    raise
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.2)

    def wait_for(self, expression: str, timeout: float = 30) -> bool:
        """Poll a JavaScript expression until it is truthy; False on timeout. A navigation
        happening meanwhile is waited out, not an error."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._evaluate_between_pages(expression, deadline - time.monotonic()):
                return True
            time.sleep(0.2)
        return False

    def screenshot(self, path: str | Path, full_page: bool = True) -> None:
        """Save a PNG of the page (the whole page, by default)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.send("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            height = min(int(size["height"]), 16000)
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": int(size["width"]),
                "height": height,
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", **params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
