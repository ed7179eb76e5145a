"""The ASGI application of ``llm-marl serve``: OpenAI's routes over the batching scheduler.

:func:`create_app` returns a Starlette app answering

- ``GET /v1/models`` (and ``/v1/models/{name}``): the served agents, one model name each;
- ``POST /v1/chat/completions``: ``messages`` through the agent's chat template;
- ``POST /v1/completions``: raw ``prompt`` text or token ids;

both with ``temperature``, ``top_p``, ``max_tokens``/``max_completion_tokens``, ``n``,
``stop``, ``seed`` and ``stream`` (server-sent events, ``data: {chunk}`` then ``data:
[DONE]``). Requests are parsed by :mod:`~llm_marl.serve.protocol`, their prompts encoded and
checked against the context (:mod:`~llm_marl.serve.prompts`), and queued as jobs on the
:class:`~llm_marl.serve.scheduler.Scheduler`, whose one worker thread decodes concurrent
requests together.

Safety: with an ``api_key`` every route wants ``Authorization: Bearer <key>`` (401 otherwise);
bodies over ``max_body_bytes`` get a 413 before they are read in full; each request ends after
``request_timeout`` seconds (504; a stream gets an error event); any failure inside a request
is that request's 500 in OpenAI's error shape, never the server's end. Every error is OpenAI's
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from typing import Any, AsyncIterator

from llm_marl.serve import protocol
from llm_marl.serve.agents import Agents
from llm_marl.serve.batch import Job
from llm_marl.serve.config import ServeConfig
from llm_marl.serve.prompts import answer_budget, chat_prompt_ids, text_prompt_ids
from llm_marl.serve.scheduler import Scheduler

__all__ = ["create_app"]

log = logging.getLogger("llm_marl.serve")
_END = object()


def _json(data: Any, status: int = 200) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(data, status_code=status)


def _error(error: protocol.APIError) -> Any:
    return _json(error.body(), error.status)


async def _read_body(request: Any, limit: int) -> bytes:
    """The body, refused with a 413 as soon as it passes ``limit`` bytes (by its declared length
    or while it arrives)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise protocol.body_too_large(limit)
        except ValueError:
            raise protocol.bad_request(f"Content-Length {declared!r:.40} is not a number.") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise protocol.body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(agents: Agents, scheduler: Scheduler, config: ServeConfig | None = None) -> Any:
    """The Starlette app serving ``agents`` through ``scheduler`` (started on the app's startup,
    stopped on its shutdown)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    config = config or ServeConfig()
    created = int(time.time())

    def authorize(request: Request) -> None:
        if not config.api_key:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {config.api_key}".encode()):
            raise protocol.unauthorized()

    def policy_of(name: str) -> Any:
        policy = agents.policies.get(name)
        if policy is None:
            raise protocol.model_not_found(name, agents.names)
        return policy

    async def models(request: Request) -> Any:
        authorize(request)
        return _json(protocol.model_list(agents.names, created))

    async def model(request: Request) -> Any:
        authorize(request)
        name = request.path_params["name"]
        policy_of(name)
        return _json(protocol.model_list([name], created)["data"][0])

    def job_of(parsed: Any, policy: Any, prompts: list[list[int]]) -> Job:
        budgets = [answer_budget(policy, len(p), parsed.max_tokens) for p in prompts]
        return Job(
            policy=policy,
            prompts=prompts,
            max_tokens=budgets,
            n=parsed.n,
            temperature=policy.temperature if parsed.temperature is None else parsed.temperature,
            top_p=policy.top_p if parsed.top_p is None else parsed.top_p,
            top_k=policy.top_k if parsed.top_k is None else parsed.top_k,
            min_tokens=min(parsed.min_tokens, min(budgets)),
            stop=parsed.stop,
            seed=parsed.seed,
        )

    async def answer(request: Request, chat: bool) -> Any:
        authorize(request)
        body = protocol.parse_json(await _read_body(request, config.max_body_bytes))
        parsed = protocol.parse_chat_request(body) if chat else protocol.parse_completion_request(body)
        policy = policy_of(parsed.model)
        from starlette.concurrency import run_in_threadpool

        if chat:
            prompts = [await run_in_threadpool(chat_prompt_ids, policy, parsed.messages)]
        else:
            prompts = [await run_in_threadpool(text_prompt_ids, policy, p) for p in parsed.prompts]
        job = job_of(parsed, policy, prompts)
        usage_in = sum(len(p) for p in prompts)
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if parsed.stream:
            loop = asyncio.get_running_loop()
            pieces: asyncio.Queue = asyncio.Queue()
            job.on_text = lambda index, text: loop.call_soon_threadsafe(pieces.put_nowait, (index, text))
            future = scheduler.submit(job)  # a full queue is a 429 before the stream starts
            future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, _END))
            return StreamingResponse(
                _stream(scheduler, job, future, pieces, parsed, chat, request_id, created_now(), usage_in, config.request_timeout),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        future = scheduler.submit(job)
        try:
            done = await asyncio.wait_for(asyncio.wrap_future(future), config.request_timeout)
        except asyncio.TimeoutError:
            scheduler.cancel(job)
            raise protocol.timed_out(config.request_timeout) from None
        except asyncio.CancelledError:  # the client left
            scheduler.cancel(job)
            raise
        usage = protocol.Usage(usage_in, done.completion_tokens)
        build = protocol.chat_completion if chat else protocol.completion
        return _json(build(request_id, parsed.model, done.choices, usage))

    async def chat_completions(request: Request) -> Any:
        return await answer(request, chat=True)

    async def completions(request: Request) -> Any:
        return await answer(request, chat=False)

    async def on_api_error(request: Request, exc: Exception) -> Any:
        return _error(exc)  # type: ignore[arg-type]

    async def on_http_error(request: Request, exc: Exception) -> Any:
        status = getattr(exc, "status_code", 500)
        if status == 404:
            return _error(protocol.not_found(request.url.path))
        if status == 405:
            return _error(protocol.method_not_allowed(request.method, request.url.path))
        return _error(protocol.APIError(status, str(getattr(exc, "detail", exc)), "invalid_request_error"))

    async def on_any_error(request: Request, exc: Exception) -> Any:
        log.exception("llm-marl serve: %s %s failed", request.method, request.url.path)
        return _error(protocol.server_error(f"{type(exc).__name__}: {exc}"))

    async def lifespan(app: Any) -> AsyncIterator[None]:
        scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{name:path}", model, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={protocol.APIError: on_api_error, HTTPException: on_http_error, Exception: on_any_error},
        lifespan=_lifespan(lifespan),
    )
    app.state.agents, app.state.scheduler, app.state.config = agents, scheduler, config
    return app


def created_now() -> int:
    return int(time.time())


def _lifespan(generator: Any) -> Any:
    import contextlib

    return contextlib.asynccontextmanager(generator)


async def _stream(
    scheduler: Scheduler, job: Job, future: Any, pieces: asyncio.Queue, parsed: Any, chat: bool, request_id: str, created: int,
    prompt_tokens: int, timeout: float,
) -> AsyncIterator[bytes]:
    """The server-sent events of one streamed request (its job submitted, its pieces of text
    arriving on ``pieces``, then an end marker): an opening chunk per choice (chat), a chunk per
    new piece of text, a closing chunk per choice with its finish reason, the usage
    (``include_usage``), then ``[DONE]``. A timeout or failure becomes an error event."""
    loop = asyncio.get_running_loop()
    model = parsed.model
    deadline = loop.time() + timeout
    try:
        if chat:
            for index in range(job.rows):
                yield protocol.sse(protocol.chat_chunk(request_id, model, created, index, "", role=True))
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise asyncio.TimeoutError
            item = await asyncio.wait_for(pieces.get(), left)
            if item is _END:
                break
            index, text = item
            chunk = protocol.chat_chunk(request_id, model, created, index, text) if chat else protocol.completion_chunk(request_id, model, created, index, text)
            yield protocol.sse(chunk)
        try:
            done = future.result()
        except protocol.APIError as error:
            yield protocol.sse(error.body())
            yield protocol.SSE_DONE
            return
        except Exception as error:  # a cancelled future (the job was dropped)
            yield protocol.sse(protocol.server_error(f"{type(error).__name__}: {error}").body())
            yield protocol.SSE_DONE
            return
        for choice in done.choices:
            if chat:
                yield protocol.sse(protocol.chat_chunk(request_id, model, created, choice.index, finish_reason=choice.finish_reason))
            else:
                yield protocol.sse(protocol.completion_chunk(request_id, model, created, choice.index, "", choice.finish_reason))
        if parsed.include_usage:
            yield protocol.sse(protocol.usage_chunk(request_id, model, created, protocol.Usage(prompt_tokens, done.completion_tokens), chat))
        yield protocol.SSE_DONE
    except asyncio.TimeoutError:
        scheduler.cancel(job)
        yield protocol.sse(protocol.timed_out(timeout).body())
        yield protocol.SSE_DONE
    finally:
        if not future.done():
            scheduler.cancel(job)
