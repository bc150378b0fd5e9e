"""Open a report in headless Chromium and look at it as a reader would: its console errors, any request it makes
that is not the file itself, its text, a click on an element, a screenshot.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages ending in a
NUL byte on file descriptors 3 and 4), so no port is opened and no package beyond the standard library is
needed. Chromium is found as ``$ATGRPO_CHROMIUM`` or ``chromium`` / ``chromium-browser`` / ``google-chrome`` on
the PATH (Debian: ``apt-get install chromium``). Used by ``atgrpo report --screenshot`` and the tests.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe")
_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """Chromium did not start, closed, or did not answer in time."""


class NoChromium(BrowserError):
    """No Chromium executable was found."""


def find_chromium() -> str | None:
    """The Chromium executable to use, or None."""
    env = os.environ.get("ATGRPO_CHROMIUM")
    if env:
        return env if shutil.which(env) else None
    return next((p for p in map(shutil.which, _NAMES) if p), None)


@dataclass
class PageLog:
    """What a page did while it was open: errors (console.error, uncaught exceptions, failed loads) and the
    URLs it requested besides ``file:`` and ``data:`` ones (a self-contained page requests none)."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def take(self, event: dict[str, Any]) -> None:
        method, p = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append("console." + p["type"] + ": " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.errors.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            self.errors.append("log: " + p["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if not url.startswith(("file:", "data:", "about:")):
                self.requests.append(url)


class Browser:
    """One headless Chromium with one page (a context manager). ``open`` a URL, ``evaluate`` JavaScript in it,
    ``click`` an element with the mouse, take a ``screenshot``; ``log`` collects errors and requests."""

    def __init__(self, executable: str | None = None, width: int = 1400, height: int = 1000, timeout: float = 60):
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise NoChromium("no Chromium found (install it: apt-get install chromium; or set ATGRPO_CHROMIUM)")
        self.width, self.height, self.timeout = width, height, timeout
        self.log = PageLog()
        self._buf, self._id, self._session = b"", 0, None
        self._profile = tempfile.mkdtemp(prefix="atgrpo-chromium-")
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()

        def fds() -> None:  # in the child: the protocol's descriptors 3 (commands in) and 4 (answers out)
            a, b = os.dup(to_child), os.dup(from_child)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._proc = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
             "about:blank"], preexec_fn=fds, close_fds=False, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                self.send(domain + ".enable")
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One protocol command (to the page once attached); its result. Events met meanwhile go to ``log``."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self._session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self._session
        try:
            os.write(self._write, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            raise BrowserError(f"Chromium ({self.executable}) closed its DevTools pipe") from None
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._next(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.log.take(reply)

    def _next(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read], [], [], left)[0]:
                raise BrowserError(f"Chromium did not answer within {self.timeout:g} s")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium ({self.executable}) exited")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values)."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression!r} raised: {r['exceptionDetails'].get('text')}")
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        """Poll a JavaScript expression until it is truthy (in JavaScript); its value, or True for an object such
        as an element (BrowserError on timeout)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        probe = f"(function () {{ var v = ({expression}); return !v ? null : (typeof v === 'object' ? true : v); }})()"
        while True:
            value = self.evaluate(probe)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression!r}")
            time.sleep(0.05)

    def open(self, url: str, ready: str = "document.body && document.body.getAttribute('data-ready')") -> None:
        """Load ``url`` and wait until ``ready`` is truthy."""
        self.send("Page.navigate", {"url": url})
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete' && ({ready})")

    def click(self, selector: str) -> None:
        """A left click of the mouse in the middle of the first element matching ``selector``."""
        box = self.evaluate(f"(function () {{ var e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                            " e.scrollIntoView({block: 'center'}); var r = e.getBoundingClientRect();"
                            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        if not box:
            raise BrowserError(f"nothing to click: no element matches {selector!r}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                   "clickCount": 0 if kind == "mouseMoved" else 1})

    def screenshot(self) -> bytes:
        """A PNG of the visible part of the page."""
        return base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                os.write(self._write, json.dumps({"id": self._id + 1, "method": "Browser.close"}).encode() + b"\0")
                self._proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self._proc.pid, signal.SIGKILL)  # its own session: Chromium and its helpers only
                self._proc.wait()
        for fd in (self._write, self._read):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)


def file_url(path: str, view: str = "") -> str:
    """The ``file://`` URL of a report, opened at ``view`` (a hash such as ``trees/0/1/0/2``)."""
    url = "file://" + os.path.abspath(path)
    return url + ("#" + view.lstrip("#") if view else "")
