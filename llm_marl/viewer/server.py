"""Serving the viewer on the loopback address (``llm-marl view RUN_DIR --serve``).

``/`` is the page built afresh on each request without the trees inside it (so reloading shows
steps recorded since); ``/rollouts/step-XXXXXX.jsonl`` and ``/rollouts/eval-XXXXXX.jsonl`` are
the recorded files, fetched by the page one step at a time. Nothing else is served.
"""

from __future__ import annotations

import http.server
import os
import re
from typing import Any

from llm_marl.runs.recording import FILE_PATTERN
from llm_marl.viewer.page import build_page


class _Handler(http.server.BaseHTTPRequestHandler):
    run_dir = "."

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", build_page(self.run_dir, embed=False).encode())
            return
        match = re.fullmatch(r"/rollouts/([^/]+)", path)
        if match and FILE_PATTERN.match(match.group(1)):
            file = os.path.join(self.run_dir, "rollouts", match.group(1))
            if os.path.isfile(file):
                with open(file, "rb") as f:
                    self._send(200, "application/x-ndjson; charset=utf-8", f.read())
                return
        self._send(404, "text/plain; charset=utf-8", f"not found: {path}".encode())

    def _send(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
        pass


def make_server(run_dir: str, port: int = 8765) -> http.server.ThreadingHTTPServer:
    """An HTTP server of the viewer on 127.0.0.1:``port`` (0: any free port); call ``serve_forever``."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir!r} does not exist")
    handler = type("ViewerHandler", (_Handler,), {"run_dir": os.path.abspath(run_dir)})
    build_page(run_dir, embed=False)  # reads every file's tree summaries once; later requests reuse them
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


def serve(run_dir: str, port: int = 8765) -> None:
    """Serve the viewer of ``run_dir`` on the loopback address until interrupted."""
    server = make_server(run_dir, port)
    print(f"llm-marl view: serving {run_dir} on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
