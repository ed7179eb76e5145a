"""Drive a headless Chromium over its DevTools pipe: open a page, run JavaScript, take a screenshot.

Used by the viewer's browser test and benchmark to check the page as a person sees it, with no
dependency beyond the browser (Debian package ``chromium``): Chromium started with
``--remote-debugging-pipe`` reads DevTools-protocol commands from its file descriptor 3 and writes
replies and events to descriptor 4, each a JSON message ending in a NUL byte.

The browser runs with ``--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
--disable-background-networking --disable-component-update --disable-sync`` and a fresh
``--user-data-dir``, so it starts the same on every machine and contacts no server.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """Path of a Chromium binary: ``$LLM_MARL_CHROMIUM``, else chromium / chromium-browser /
    google-chrome on the PATH; None when there is none."""
    override = os.environ.get("LLM_MARL_CHROMIUM")
    if override:
        return override
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    """Chromium failed to start, answered a command with an error, or did not answer in time."""


class Chromium:
    """One headless Chromium with one page. Use as a context manager.

    ``console_errors`` collects uncaught exceptions, ``console.error`` calls and browser log
    entries of level error, each as a string.
    """

    def __init__(self, binary: str | None = None, width: int = 1400, height: int = 1000, timeout: float = 30.0):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError("no Chromium found (install the Debian package `chromium` or set LLM_MARL_CHROMIUM)")
        self.timeout = timeout
        self.console_errors: list[str] = []
        self._profile = tempfile.mkdtemp(prefix="llm-marl-chromium-")
        self._next_id = 0
        self._replies: dict[int, queue.Queue] = {}
        self._events: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        commands_read, self._commands = os.pipe()
        self._replies_fd, replies_write = os.pipe()
        # the child's ends moved above fd 10, so that bash (dash takes single-digit fds only) places
        # them at 3 and 4 without a clash, with no code run between fork and exec
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (commands_read, replies_write)]
        for fd in (commands_read, replies_write):
            os.close(fd)
        self._stderr_path = os.path.join(self._profile, "stderr.log")
        self._stderr = open(self._stderr_path, "wb")
        script = f'exec "$0" "$@" 3<&{ends[0]} 4>&{ends[1]} {ends[0]}<&- {ends[1]}>&-'
        try:
            self.process = subprocess.Popen(
                [shutil.which("bash") or "/bin/bash", "-c", script, self.binary, *FLAGS, f"--user-data-dir={self._profile}",
                 f"--window-size={width},{height}", "about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                pass_fds=ends,
            )
        finally:
            for fd in ends:
                os.close(fd)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable", session=True)
            self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height, deviceScaleFactor=1, mobile=False)
        except BrowserError as exc:
            tail = self._stderr_tail()
            self.close()
            raise BrowserError(f"{exc}; Chromium's stderr ends with: {tail}") from None
        except BaseException:
            self.close()
            raise

    @classmethod
    def start(cls, attempts: int = 2, **settings: Any) -> "Chromium":
        """A started browser; a start that fails (a browser that exits at once on a loaded machine)
        is tried again, up to ``attempts`` times, and the last error is raised."""
        for attempt in range(attempts):
            try:
                return cls(**settings)
            except BrowserError as exc:
                if attempt == attempts - 1 or str(exc).startswith("no Chromium found"):
                    raise
        raise AssertionError("unreachable")

    def _stderr_tail(self, limit: int = 800) -> str:
        try:
            with open(self._stderr_path, "rb") as f:
                return f.read()[-limit:].decode(errors="replace").strip() or "(nothing)"
        except OSError:
            return "(unreadable)"

    # --- the protocol ---------------------------------------------------------------------------

    def _read(self) -> None:
        pending = b""
        while True:
            try:
                data = os.read(self._replies_fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                self._events.put(None)
                for waiting in list(self._replies.values()):
                    waiting.put({"error": {"message": "Chromium closed its DevTools pipe"}})
                return
            pending += data
            *messages, pending = pending.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message and message["id"] in self._replies:
                    self._replies[message["id"]].put(message)
                else:
                    self._note(message)

    def _note(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.console_errors.append(f"uncaught: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.console_errors.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.console_errors.append(f"log: {params['entry'].get('text')} ({params['entry'].get('url', '')})")
        self._events.put(message)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one DevTools command (to the page when ``session``) and return its result."""
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            self._replies[ident] = queue.Queue()
        message = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        try:
            os.write(self._commands, json.dumps(message).encode() + b"\0")
        except OSError as exc:  # the browser is gone (EPIPE)
            self._replies.pop(ident, None)
            raise BrowserError(f"{method}: Chromium closed its DevTools pipe ({exc.strerror})") from None
        try:
            reply = self._await(ident, method)
        finally:
            self._replies.pop(ident, None)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')} {reply['error'].get('data', '')}".strip())
        return reply.get("result", {})

    def _await(self, ident: int, method: str) -> dict[str, Any]:
        """The reply to command ``ident``; an error as soon as the browser process is gone (its
        pipe may stay open in a process forked meanwhile) or after ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._replies[ident].get(timeout=0.2)
            except queue.Empty:
                pass
            code = self.process.poll()
            if code is not None:
                raise BrowserError(f"{method}: Chromium exited with code {code}")
            if time.monotonic() > deadline:
                raise BrowserError(f"{method}: no answer from Chromium within {self.timeout} s")

    def wait_for(self, method: str) -> dict[str, Any]:
        """The next event named ``method`` (earlier other events are dropped)."""
        while True:
            try:
                event = self._events.get(timeout=self.timeout)
            except queue.Empty:
                raise BrowserError(f"no {method} event within {self.timeout} s") from None
            if event is None:
                raise BrowserError(f"Chromium exited while waiting for {method}")
            if event.get("method") == method:
                return event.get("params", {})

    # --- what a test needs ----------------------------------------------------------------------

    def open(self, url: str) -> None:
        """Navigate the page to ``url`` and wait for its load event."""
        while not self._events.empty():
            self._events.get_nowait()
        result = self.call("Page.navigate", session=True, url=url)
        if result.get("errorText"):
            raise BrowserError(f"cannot open {url}: {result['errorText']}")
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self.call("Runtime.evaluate", session=True, expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"JavaScript error: {details.get('exception', {}).get('description') or details.get('text')}")
        return result.get("result", {}).get("value")

    def screenshot(self, path: str) -> str:
        """Save a PNG of the whole page to ``path``."""
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def close(self) -> None:
        """Close the browser and remove its profile folder."""
        if getattr(self, "process", None) is not None and self.process.poll() is None:
            try:
                os.write(self._commands, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        if getattr(self, "_reader", None) is not None:
            self._reader.join(timeout=2)
        for fd in (self._commands, self._replies_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
