"""The local OpenAI-compatible endpoint that programs call while they are trained.

One :class:`Endpoint` serves a :class:`~llm_marl.programs.ProgramEnv` and all its forks: a real
HTTP server (Starlette on uvicorn, as ``llm-marl serve``; extra ``program``) on ``127.0.0.1`` at
an ephemeral port, started on the first rollout and stopped by ``env.close()``, when the last env
that uses it is garbage-collected, or at interpreter exit.

Each running program (:class:`~llm_marl.programs.run.ProgramRun`) has its own base URL,
``http://127.0.0.1:PORT/run/<id>/v1``, so concurrent rollouts never mix their calls. Under it:

- ``POST /chat/completions`` and ``POST /completions``: a call. Parsed by
  :mod:`llm_marl.serve.protocol` (the dialect ``llm-marl serve`` speaks); ``model`` must name an
  agent, ``n`` must be 1. The call waits until the env's step answers it with the agent's action.
  ``stream: true`` is answered as server-sent events (the whole reply in one chunk). Sampling
  settings in the call (``temperature``, ``max_tokens``, ``stop``, ``seed``) are not used: while
  training, the agent samples as its learner's config says;
- ``GET /models``: the agents.

A refused call (an unknown model, a bad parameter, an unknown path) gets OpenAI's error JSON and
status, and marks the program's rollout failed with that message. A call to a run that has ended
(or was cancelled) gets a 503.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
import weakref
from typing import Any

CLIENT_HEADER = "x-llm-marl-client"
ORDER_HEADER = "x-llm-marl-order"
"""The rank of a call among its run's calls in the order the program issued them (stamped by the
client the run hands the program), so calls sent together are held in the program's order, not
in the order they reach the server."""
"""Sent by the clients a ProgramEnv hands to programs: their calls count towards the step rule."""


class Endpoint:
    """A lazily started local endpoint; :meth:`add` a run to get its base URL."""

    def __init__(self) -> None:
        self._runs: dict[str, Any] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._server: Any = None
        self._finalizer: weakref.finalize | None = None
        self.port: int | None = None

    def add(self, run: Any) -> str:
        """Register ``run`` (starting the server if needed); returns its base URL."""
        self.start()
        with self._lock:
            run_id = f"r{next(self._ids)}"
            self._runs[run_id] = run
        return f"http://127.0.0.1:{self.port}/run/{run_id}/v1"

    def remove(self, base_url: str) -> None:
        """Forget the run of ``base_url``: its later calls get a 503."""
        run_id = base_url.rstrip("/").split("/")[-2]
        with self._lock:
            self._runs.pop(run_id, None)

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Start the server on 127.0.0.1 at a free port (once)."""
        with self._lock:
            if self._server is not None:
                return
            import uvicorn

            # proto IPPROTO_TCP: asyncio then sets TCP_NODELAY on accepted connections (~40 ms a
            # call otherwise, a reply written in two pieces waiting for the delayed ACK)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
            config = uvicorn.Config(_app(self._runs, self._lock), log_level="error", access_log=False, lifespan="off", timeout_graceful_shutdown=2)
            server = uvicorn.Server(config)
            thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"llm-marl-endpoint-{self.port}", daemon=True)
            thread.start()
            deadline = time.monotonic() + 30
            while not server.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    server.should_exit = True
                    thread.join(5)
                    sock.close()
                    raise RuntimeError(f"the program endpoint on 127.0.0.1:{self.port} did not start")
                time.sleep(0.001)
            self._server = server
            self._finalizer = weakref.finalize(self, _stop, server, thread, sock, self._runs, self._lock)

    def close(self) -> None:
        """Cancel the runs still registered, then stop the server."""
        with self._lock:
            finalizer, self._finalizer, self._server = self._finalizer, None, None
        if finalizer is not None:
            finalizer()


def _stop(server: Any, thread: threading.Thread, sock: socket.socket, runs: dict[str, Any], lock: threading.Lock) -> None:
    with lock:
        live = list(runs.values())
        runs.clear()
    for run in live:
        run.cancel()
    server.should_exit = True
    thread.join(10)
    sock.close()


def _app(runs: dict[str, Any], lock: threading.Lock) -> Any:
    """The Starlette application over ``runs`` (run id -> ProgramRun)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from llm_marl.serve import protocol

    def error(exc: "protocol.APIError") -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    def run_of(request: Any) -> Any:
        with lock:
            return runs.get(request.path_params["run"])

    ended = protocol.APIError(503, "This program run has ended (or was cancelled): its calls are no longer answered.", "server_error", None, "run_ended")

    async def call(request: Any, chat: bool) -> Response:
        run = run_of(request)
        if run is None:
            return error(ended)
        ours = request.headers.get(CLIENT_HEADER) == "1"
        try:
            body = protocol.parse_json(await request.body())
            parsed = protocol.parse_chat_request(body) if chat else protocol.parse_completion_request(body)
            if parsed.model not in run.agents:
                raise protocol.model_not_found(parsed.model, run.agents)
            if parsed.n != 1:
                raise protocol.bad_request("n must be 1 while training: each call is one action of its agent.", "n", "invalid_value")
            if not chat and (len(parsed.prompts) != 1 or not isinstance(parsed.prompts[0], str)):
                raise protocol.bad_request("prompt must be one string while training.", "prompt", "invalid_value")
        except protocol.APIError as exc:
            run.fail(f"a call was refused ({exc.status}): {exc.message}")
            return error(exc)
        observation = parsed.messages if chat else parsed.prompts[0]
        order = request.headers.get(ORDER_HEADER)
        future = run.submit(parsed.model, observation, ours, int(order) if ours and order and order.isdigit() else None)
        if future is None:
            return error(ended)
        try:
            text = await asyncio.wrap_future(future)
        except Exception:
            return error(ended)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{request.path_params['run']}-{id(future):x}"
        choice = protocol.Choice(0, text, "stop")
        usage = protocol.Usage(0, 0)
        if parsed.stream:
            created = int(time.time())
            if chat:
                events = [protocol.chat_chunk(request_id, parsed.model, created, 0, role=True), protocol.chat_chunk(request_id, parsed.model, created, 0, text=text),
                          protocol.chat_chunk(request_id, parsed.model, created, 0, finish_reason="stop")]
            else:
                events = [protocol.completion_chunk(request_id, parsed.model, created, 0, text, "stop")]
            if parsed.include_usage:
                events.append(protocol.usage_chunk(request_id, parsed.model, created, usage, chat=chat))
            payload = [protocol.sse(event) for event in events] + [protocol.SSE_DONE]
            return StreamingResponse(iter(payload), media_type="text/event-stream")
        build = protocol.chat_completion if chat else protocol.completion
        return JSONResponse(build(request_id, parsed.model, [choice], usage))

    async def chat_completions(request: Any) -> Response:
        return await call(request, True)

    async def completions(request: Any) -> Response:
        return await call(request, False)

    async def models(request: Any) -> Response:
        run = run_of(request)
        return error(ended) if run is None else JSONResponse(protocol.model_list(run.agents))

    async def other(request: Any) -> Response:
        run = run_of(request)
        exc = protocol.not_found("/v1/" + request.path_params.get("rest", ""))
        if run is not None:
            run.fail(f"a call was refused ({exc.status}): {exc.message}")
        return error(exc)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[
        Route("/run/{run}/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/run/{run}/v1/completions", completions, methods=["POST"]),
        Route("/run/{run}/v1/models", models, methods=["GET"]),
        Route("/run/{run}/v1/{rest:path}", other, methods=methods),
    ])
