"""Headless Chromium for the tests that open a page (reports, the docs site): where it is
(``chromium``, ``needs_chromium``), and a ``Browser`` driven over the DevTools protocol on a
pipe (``--remote-debugging-pipe``: JSON messages separated by NUL bytes on file descriptors 3
and 4), so a test can wait for what scripts do after the page loads (the docs' search runs in
a web worker) and collect every console error and uncaught exception. Standard library only."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from typing import Any

import pytest


def chromium() -> str | None:
    """Debian's ``chromium`` (installed in CI) or another Chrome on the path."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    return None


needs_chromium = pytest.mark.skipif(
    chromium() is None, reason="no headless Chromium here (Debian: apt-get install chromium)"
)


class Browser:
    """One headless Chromium with one page; ``errors`` collects console errors, uncaught
    exceptions and failed loads from every page opened."""

    def __init__(self, width: int = 1280, height: int = 1600):
        r3, w3 = os.pipe()  # we write commands, Chromium reads fd 3
        r4, w4 = os.pipe()  # Chromium writes fd 4, we read
        args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-extensions", f"--window-size={width},{height}", "--hide-scrollbars",
                "--remote-debugging-pipe", "about:blank"]  # fmt: skip

        def fds() -> None:
            # in the child, before it closes what is not kept: the pipe ends onto 3 and 4
            # (through fresh copies, in case either end already sits on 3 or 4)
            a, b = os.dup(r3), os.dup(w4)
            os.dup2(a, 3)
            os.dup2(b, 4)

        quiet = subprocess.DEVNULL
        self.proc = subprocess.Popen(args, pass_fds=(3, 4), preexec_fn=fds, stdout=quiet,
                                     stderr=quiet)  # fmt: skip
        os.close(r3)
        os.close(w4)
        self._w, self._r = w3, r4
        self._buf = b""
        self._id = 0
        self.errors: list[str] = []
        target = next(t for t in self.call("Target.getTargets")["targetInfos"]
                      if t["type"] == "page")  # fmt: skip
        self.session = self.call("Target.attachToTarget", targetId=target["targetId"],
                                 flatten=True)["sessionId"]  # fmt: skip
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    def _send(self, msg: dict) -> None:
        os.write(self._w, json.dumps(msg).encode() + b"\0")

    def _read(self, timeout: float) -> dict | None:
        end = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                return None
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg = json.loads(raw)
        self._event(msg)
        return msg

    def _event(self, msg: dict) -> None:
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.errors.append(f"uncaught: {d.get('exception', {}).get('description') or d}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") == "error":
            self.errors.append("console.error: " + " ".join(
                str(a.get("value", a.get("description"))) for a in p.get("args", [])))  # fmt: skip
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            self.errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            self.errors.append(f"load failed: {p.get('errorText')}")
        elif method == "Page.loadEventFired":
            self._loaded = True

    def call(self, method: str, session: bool = False, timeout: float = 60, **params) -> Any:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self._send(msg)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = self._read(end - time.monotonic())
            if got and got.get("id") == self._id:
                if "error" in got:
                    raise RuntimeError(f"{method}: {got['error']}")
                return got["result"]
        raise TimeoutError(f"{method} got no answer in {timeout} s")

    def open(self, url: str, timeout: float = 60) -> None:
        """Navigate and wait for the load event."""
        self._loaded = False
        self.call("Page.navigate", session=True, url=url)
        end = time.monotonic() + timeout
        while not self._loaded and time.monotonic() < end:
            self._read(end - time.monotonic())
        if not self._loaded:
            raise TimeoutError(f"{url} did not load in {timeout} s")

    def eval(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", session=True, expression=expression,
                      returnByValue=True, awaitPromise=True)  # fmt: skip
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        """Poll ``expression`` until it is truthy (events are read meanwhile)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if value := self.eval(expression):
                return value
            self._read(0.25)
        raise TimeoutError(f"{expression} stayed false for {timeout} s")

    def screenshot(self) -> bytes:
        shot = self.call("Page.captureScreenshot", session=True, format="png")
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            os.close(self._w)
            os.close(self._r)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
