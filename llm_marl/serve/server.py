"""Running the app: in the foreground (the command) or on a background thread (tests, programs).

:class:`BackgroundServer` runs an ASGI app with uvicorn on its own thread and event loop,
listening on a socket it binds itself (port 0: a free port, known at once as
:attr:`BackgroundServer.base_url`); :meth:`~BackgroundServer.stop` shuts it down and joins the
thread, leaving no socket or thread behind. :func:`serve_forever` runs one in the foreground
until Ctrl-C.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

__all__ = ["BackgroundServer", "bind", "serve_forever"]


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket bound to ``host:port`` (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _config(app: Any, log_level: str) -> Any:
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, lifespan="on", access_log=False, timeout_graceful_shutdown=5)


class BackgroundServer:
    """``app`` served by uvicorn on a thread (see the module docstring); a context manager."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import uvicorn

        self.socket = bind(host, port)
        self.host, self.port = self.socket.getsockname()[:2]
        self.server = uvicorn.Server(_config(app, log_level))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, name="llm-marl-serve-http", daemon=True)

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``, what an ``openai`` client takes as ``base_url``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self.thread.start()
        waited = 0.0
        while not self.server.started and self.thread.is_alive() and waited < timeout:
            threading.Event().wait(0.01)
            waited += 0.01
        if not self.server.started:
            self.stop()
            raise RuntimeError(f"the server on {self.base_url} did not start within {timeout:g} s")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.socket.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_forever(app: Any, sock: socket.socket, log_level: str = "info") -> None:
    """Serve ``app`` on the bound socket ``sock`` (:func:`bind`) in the foreground until Ctrl-C
    (or SIGTERM); the socket is closed afterwards."""
    import uvicorn

    try:
        uvicorn.Server(_config(app, log_level)).run(sockets=[sock])
    finally:
        sock.close()
