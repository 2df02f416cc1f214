"""Headless Chromium for tests: open a page over the DevTools protocol and report what a person's
browser would show (console messages, uncaught exceptions, network requests) plus facts read from
the rendered DOM.

The protocol runs over a pipe (`--remote-debugging-pipe`: the browser reads commands on fd 3 and
writes replies on fd 4, each a JSON message ended by a NUL byte), so no port is opened and nothing
beyond Debian's `chromium` package is needed (no playwright, no driver download).

    page = load_page(exe, "/tmp/report.html", user_data_dir=tmp, evaluate="document.title")
    page.errors      # console errors/warnings, exceptions, failed loads
    page.requests    # every URL the page asked for
    page.value       # what `evaluate` returned
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
    "--window-size=1280,2000",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Page:
    errors: list[str] = field(default_factory=list)  # console error/warning, exceptions, log errors
    console: list[str] = field(default_factory=list)  # every console message
    requests: list[str] = field(default_factory=list)  # every URL requested by the page
    value: object = None  # the result of `evaluate`
    screenshot: bytes = b""


def high_fd(fd: int) -> int:
    """A duplicate of `fd` numbered 10 or more (the original is closed)."""
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class DevTools:
    def __init__(self, exe: str, user_data_dir: Path):
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        # Lift the child's ends above 9, so that putting them on 3 and 4 cannot overwrite each other.
        to_browser_r, from_browser_w = (high_fd(fd) for fd in (to_browser_r, from_browser_w))

        def on_fds_3_and_4():  # in the child, before exec: where --remote-debugging-pipe expects them
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        # close_fds=False: Python's own fds are close-on-exec anyway; closing all others would close 3 and 4.
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            preexec_fn=on_fds_3_and_4,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30.0) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self.receive(timeout)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def receive(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_browser], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer within {timeout} s")
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def wait_for(self, method: str, session: str, timeout: float = 30.0) -> dict:
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        while True:
            event = self.receive(timeout)
            self.events.append(event)
            if event.get("method") == method and event.get("sessionId") == session:
                return event

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_browser)
        os.close(self.from_browser)


def load_page(
    exe: str, path: Path, *, user_data_dir: Path, evaluate: str | None = None, screenshot: bool = False
) -> Page:
    """Open `path` in a fresh headless Chromium, wait for its load event, and report what happened."""
    tools = DevTools(exe, user_data_dir)
    try:
        target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.send(f"{domain}.enable", session=session)
        tools.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
        tools.wait_for("Page.loadEventFired", session)
        page = Page()
        if evaluate:
            result = tools.send("Runtime.evaluate", {"expression": evaluate, "returnByValue": True}, session=session)
            if "exceptionDetails" in result:
                raise RuntimeError(f"evaluate failed: {result['exceptionDetails']}")
            page.value = result["result"].get("value")
        if screenshot:
            page.screenshot = base64.b64decode(
                tools.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=session)[
                    "data"
                ]
            )
        for event in tools.events:
            if event.get("sessionId") != session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                page.console.append(f"{params.get('type')}: {text}")
                if params.get("type") in ("error", "warning", "assert"):
                    page.errors.append(f"console.{params['type']}: {text}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                page.errors.append(
                    f"exception: {details.get('exception', {}).get('description') or details.get('text')}"
                )
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                page.console.append(f"{entry.get('level')}: {entry.get('text')}")
                if entry.get("level") in ("error", "warning"):
                    page.errors.append(
                        f"log {entry.get('level')} ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}"
                    )
            elif method == "Network.requestWillBeSent":
                page.requests.append(params["request"]["url"])
            elif method == "Network.loadingFailed":
                page.errors.append(f"load failed: {params.get('errorText')}")
        return page
    finally:
        tools.close()
