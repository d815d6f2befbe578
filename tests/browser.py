"""Drive headless Chromium over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

The pipe needs no port and no third-party client: Chromium reads commands from fd 3 and writes
replies and events to fd 4, one JSON message per NUL-terminated chunk. `Browser` starts it,
`Browser.open` attaches a page session, and `Page` evaluates JavaScript, waits for a condition,
collects console errors, uncaught exceptions and every network request, and takes screenshots.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]


def chromium_path() -> str | None:
    """The Chromium executable on PATH (Debian's ``chromium``), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    """A headless Chromium process; use as a context manager."""

    def __init__(self, executable: str | None = None, timeout_s: float = 60.0) -> None:
        self.executable = executable or chromium_path()
        if self.executable is None:
            raise BrowserError("chromium is not installed")
        self.timeout_s = timeout_s
        self._next_id = 0
        self._replies: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self._pages: dict[str, Page] = {}

    def __enter__(self) -> Browser:
        self._profile = tempfile.mkdtemp(prefix="gpuprof-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # in the child: its fd 3 reads our commands, fd 4 takes replies
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            preexec_fn=fds,
            pass_fds=(3, 4),
            start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call("Browser.close", timeout_s=5)
        except Exception:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 20)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    box = self._replies.get(message["id"])
                    if box is not None:
                        box.put(message)
                elif (page := self._pages.get(message.get("sessionId", ""))) is not None:
                    page._event(message)

    def call(
        self, method: str, session: str | None = None, timeout_s: float | None = None, **params
    ) -> dict[str, Any]:
        """Send one DevTools command and return its result (raises on a protocol error)."""
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            box: queue.Queue = queue.Queue()
            self._replies[ident] = box
            message: dict[str, Any] = {"id": ident, "method": method, "params": params}
            if session:
                message["sessionId"] = session
            os.write(self._to_child, json.dumps(message).encode() + b"\0")
        try:
            reply = box.get(timeout=timeout_s or self.timeout_s)
        except queue.Empty:
            raise BrowserError(f"{method}: no reply from chromium") from None
        finally:
            self._replies.pop(ident, None)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def open(self, url: str, width: int = 1400, height: int = 1000) -> Page:
        """A new page with console, exception and network capture on, navigated to ``url``
        (returns once the load event fired)."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        page = Page(self, session)
        self._pages[session] = page
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        page.navigate(url)
        return page


class Page:
    """One attached page session."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session
        self.errors: list[str] = []
        """Console errors, uncaught exceptions and error log entries, as text."""
        self.requests: list[str] = []
        """Every URL the page requested."""
        self._loaded = threading.Event()

    def _event(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
            self.errors.append("console: " + " ".join(str(a) for a in args))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"exception: {text}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.errors.append(f"log: {params['entry'].get('text')}")
        elif method == "Network.requestWillBeSent":
            self.requests.append(params.get("request", {}).get("url", ""))
        elif method == "Page.loadEventFired":
            self._loaded.set()

    def call(self, method: str, **params) -> dict[str, Any]:
        return self.browser.call(method, session=self.session, **params)

    def navigate(self, url: str, timeout_s: float = 60.0) -> None:
        self._loaded.clear()
        self.call("Page.navigate", url=url)
        if not self._loaded.wait(timeout_s):
            raise BrowserError(f"{url}: page did not load within {timeout_s} s")

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        """The value of a JavaScript expression (JSON-serialisable values only)."""
        result = self.call(
            "Runtime.evaluate",
            expression=expression,
            returnByValue=True,
            awaitPromise=await_promise,
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Poll until ``expression`` is truthy; return its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise BrowserError(f"timed out waiting for {expression!r}; errors: {self.errors}")

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element (scrolled into view first)."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """Save a PNG of the page (the whole scroll height with ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": metrics["width"],
                "height": min(metrics["height"], 16000),
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
