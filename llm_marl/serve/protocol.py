"""The OpenAI wire format: request bodies in, response and error bodies out.

Pure functions and dataclasses, no web framework and no torch: ``llm-marl serve``
(:mod:`llm_marl.serve.app`) and the endpoint that programs train against both read requests and
write answers through this module, so both speak the same dialect.

Requests. :func:`parse_chat_request` reads a ``/v1/chat/completions`` body and
:func:`parse_completion_request` a ``/v1/completions`` body (already decoded from JSON by
:func:`parse_json`) into a :class:`ChatRequest` or :class:`CompletionRequest`. Accepted:

- ``model`` (the agent's name), ``messages`` (roles ``system``, ``developer`` (read as
  ``system``), ``user``, ``assistant``; ``content`` a string or a list of ``{"type": "text",
  "text": ...}`` parts) or ``prompt`` (a string, a list of strings, a list of token ids or a
  list of such lists);
- ``temperature`` in [0, 2] (0: the most likely token), ``top_p`` in [0, 1] (0: the most likely
  token), ``top_k`` (an extension, as vLLM's; -1 or 0: off), ``max_completion_tokens`` or its
  older name ``max_tokens`` (>= 1), ``min_tokens`` (an extension, as vLLM's: no end-of-sequence
  token before that many tokens; stop strings still end an answer), ``n`` (1-128), ``stop`` (a string or up to 4), ``seed``,
  ``stream`` and ``stream_options.include_usage``. Omitted sampling settings are None: the
  server uses the agent's own (those it was trained with);
- ignored when neutral: ``frequency_penalty``/``presence_penalty`` 0, ``logprobs`` false,
  ``logit_bias`` empty, ``tools`` empty, ``response_format`` text, ``user``, ``metadata``,
  ``store``, ``service_tier``, ``parallel_tool_calls``. Anything else (an unknown field, or a
  feature this server does not have, such as tools) is refused with a 400 that names it,
  as OpenAI refuses unknown arguments.

Errors. Every refusal is an :class:`APIError`: an HTTP status and OpenAI's error body
``{"error": {"message", "type", "param", "code"}}`` (:meth:`APIError.body`). The constructors
name the cases: :func:`bad_request` (400), :func:`unauthorized` (401), :func:`model_not_found`
(404), :func:`context_length_exceeded` (400), :func:`body_too_large` (413),
:func:`queue_full` (429), :func:`server_error` (500), :func:`timed_out` (504).

Responses. :func:`chat_completion` and :func:`completion` build whole answers,
:func:`chat_chunk`, :func:`completion_chunk` and :func:`usage_chunk` the pieces of a stream
(server-sent events, :func:`sse`, ending with :data:`SSE_DONE`), :func:`model_list` the
``/v1/models`` answer.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = [
    "APIError",
    "ChatRequest",
    "Choice",
    "CompletionRequest",
    "MAX_N",
    "MAX_STOP",
    "SSE_DONE",
    "Usage",
    "bad_request",
    "body_too_large",
    "chat_chunk",
    "chat_completion",
    "completion",
    "completion_chunk",
    "context_length_exceeded",
    "error_body",
    "method_not_allowed",
    "model_list",
    "model_not_found",
    "not_found",
    "parse_chat_request",
    "parse_completion_request",
    "parse_json",
    "queue_full",
    "server_error",
    "sse",
    "timed_out",
    "unauthorized",
    "usage_chunk",
]

MAX_N = 128
"""The most answers one request may ask for (``n``)."""
MAX_STOP = 4
"""The most stop sequences one request may give (OpenAI's limit)."""
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
"""Message roles accepted, and the role each becomes in the chat template."""
SSE_DONE = b"data: [DONE]\n\n"
"""The last event of every stream."""


# ------------------------------------------------------------------------------------------ errors


class APIError(Exception):
    """A request refused: ``status`` (HTTP) and OpenAI's error fields."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return error_body(self.message, self.type, self.param, self.code)

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """400: a parameter (``param``) or the body is wrong."""
    return APIError(400, message, "invalid_request_error", param, code)


def unauthorized() -> APIError:
    """401: no ``Authorization: Bearer <key>`` header, or the wrong key."""
    return APIError(401, "Incorrect or missing API key: send the header 'Authorization: Bearer <key>' with the server's --api-key.", "invalid_request_error", None, "invalid_api_key")


def model_not_found(model: str, available: Sequence[str] = ()) -> APIError:
    """404: no agent of this name."""
    known = f" This server has: {', '.join(available)}." if available else ""
    return APIError(404, f"The model `{model}` does not exist.{known}", "invalid_request_error", "model", "model_not_found")


def context_length_exceeded(context_length: int, prompt_tokens: int, max_tokens: int | None = None) -> APIError:
    """400: the prompt (plus the tokens asked for) does not fit the model's context."""
    if max_tokens is None:
        message = f"This model's maximum context length is {context_length} tokens. However, your prompt has {prompt_tokens} tokens, leaving no room for an answer."
        param = "messages"
    else:
        message = (
            f"This model's maximum context length is {context_length} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the completion). "
            "Please reduce the prompt or the completion length."
        )
        param = "max_tokens"
    return APIError(400, message, "invalid_request_error", param, "context_length_exceeded")


def body_too_large(limit: int) -> APIError:
    """413: the request body is larger than the server accepts."""
    return APIError(413, f"The request body is larger than this server accepts ({limit} bytes).", "invalid_request_error", None, "request_too_large")


def queue_full(limit: int) -> APIError:
    """429: ``limit`` requests are already waiting or running."""
    return APIError(429, f"The server is busy: {limit} requests are already waiting or running; retry later.", "rate_limit_error", None, "queue_full")


def timed_out(seconds: float) -> APIError:
    """504: the answer took longer than the server's per-request timeout."""
    return APIError(504, f"The request took longer than this server's timeout ({seconds:g} s).", "timeout_error", None, "timeout")


def server_error(message: str) -> APIError:
    """500: the server failed on this request (it keeps serving others)."""
    return APIError(500, f"The server failed on this request: {message}", "server_error", None, None)


def not_found(path: str) -> APIError:
    """404: no such route."""
    return APIError(404, f"Unknown path {path}: this server answers /v1/models, /v1/chat/completions and /v1/completions.", "invalid_request_error", None, "unknown_url")


def method_not_allowed(method: str, path: str) -> APIError:
    """405: a route called with the wrong method."""
    return APIError(405, f"{method} is not allowed on {path}.", "invalid_request_error", None, "method_not_allowed")


# ----------------------------------------------------------------------------------------- requests


@dataclass
class _Sampling:
    model: str
    """The agent that answers."""
    temperature: float | None = None
    """Sampling temperature in [0, 2] (0: the most likely token); None: the agent's own."""
    top_p: float | None = None
    """Nucleus threshold in [0, 1] (0: the most likely token); None: the agent's own."""
    top_k: int | None = None
    """Keep the k most likely tokens (an extension; 0: off); None: the agent's own."""
    max_tokens: int | None = None
    """Cap on the answer's tokens (``max_completion_tokens``, or ``max_tokens``); None: the agent's own."""
    min_tokens: int = 0
    """No end-of-sequence token before this many tokens (an extension, as vLLM's)."""
    n: int = 1
    """Answers to the request (choices)."""
    stop: tuple[str, ...] = ()
    """An answer ends before the first of these strings (not included)."""
    seed: int | None = None
    """The same seed and request give the same answer (None: the server's random stream)."""
    stream: bool = False
    """Answer as server-sent events, one chunk per new piece of text."""
    include_usage: bool = False
    """With ``stream``: a last chunk with the token counts (``stream_options.include_usage``)."""


@dataclass
class ChatRequest(_Sampling):
    """A ``/v1/chat/completions`` request (:func:`parse_chat_request`)."""

    messages: list[dict[str, str]] = field(default_factory=list)
    """``{"role", "content"}`` messages, roles system/user/assistant, content plain text."""


@dataclass
class CompletionRequest(_Sampling):
    """A ``/v1/completions`` request (:func:`parse_completion_request`)."""

    prompts: list[str | list[int]] = field(default_factory=list)
    """The prompts (raw text, or token ids), each answered ``n`` times."""


_NEUTRAL: dict[str, Any] = {
    "frequency_penalty": lambda v: v in (None, 0),
    "presence_penalty": lambda v: v in (None, 0),
    "logprobs": lambda v: v is None or v is False,
    "top_logprobs": lambda v: v is None or (_is_int(v) and v == 0),
    "logit_bias": lambda v: not v,
    "tools": lambda v: not v,
    "tool_choice": lambda v: v in (None, "none", "auto"),
    "functions": lambda v: not v,
    "function_call": lambda v: v in (None, "none", "auto"),
    "parallel_tool_calls": lambda v: True,
    "response_format": lambda v: v is None or (isinstance(v, Mapping) and v.get("type") == "text"),
    "user": lambda v: True,
    "metadata": lambda v: True,
    "store": lambda v: v in (None, False),
    "service_tier": lambda v: True,
    "best_of": lambda v: v in (None, 1),
    "echo": lambda v: v in (None, False),
    "suffix": lambda v: v in (None, ""),
}
"""Fields accepted only with a value that changes nothing here (``value -> acceptable``)."""

_SAMPLING_KEYS = {"model", "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "min_tokens", "n", "stop", "seed", "stream", "stream_options"}
_CHAT_KEYS = _SAMPLING_KEYS | {"messages"}
_COMPLETION_KEYS = _SAMPLING_KEYS | {"prompt"}


def parse_json(raw: bytes) -> Any:
    """The JSON value of a request body (400 when it is not UTF-8 JSON)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise bad_request(f"The request body is not UTF-8 text (byte {exc.start}).") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}).") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_number(value) or not low <= value <= high:
        raise bad_request(f"{key} must be a number between {low:g} and {high:g}; got {value!r:.60}.", key, "invalid_value")
    return float(value)


def _integer(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise bad_request(f"{key} must be an integer {bound}; got {value!r:.60}.", key, "invalid_value")
    return int(value)


def _check_keys(body: Mapping[str, Any], known: set[str]) -> None:
    for key, value in body.items():
        if key in known:
            continue
        if key in _NEUTRAL:
            if not _NEUTRAL[key](value):
                raise bad_request(f"{key}={value!r:.60} is not supported by this server (only its neutral value is accepted).", key, "unsupported_parameter")
            continue
        raise bad_request(f"Unrecognized request argument supplied: {key}", key, "unrecognized_argument")


def _sampling(body: Any, known: set[str]) -> dict[str, Any]:
    if not isinstance(body, Mapping):
        raise bad_request(f"The request body must be a JSON object; got {type(body).__name__}.")
    _check_keys(body, known)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required: the name of the agent that answers (GET /v1/models lists them).", "model", "missing_required_parameter" if model is None else "invalid_type")
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    top_k = _integer(body, "top_k", -1)
    if top_k is not None and top_k <= 0:
        top_k = 0
    new = _integer(body, "max_completion_tokens", 1)
    old = _integer(body, "max_tokens", 1)
    if new is not None and old is not None and new != old:
        raise bad_request(f"max_tokens ({old}) and max_completion_tokens ({new}) disagree; give one of them.", "max_tokens", "invalid_value")
    n = _integer(body, "n", 1, MAX_N)
    least = _integer(body, "min_tokens", 0) or 0
    most = new if new is not None else old
    if most is not None and least > most:
        raise bad_request(f"min_tokens ({least}) is more than max_tokens ({most}).", "min_tokens", "invalid_value")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP:
        stops = tuple(stop)
    else:
        raise bad_request(f"stop must be a string or a list of at most {MAX_STOP} strings; got {stop!r:.60}.", "stop", "invalid_value")
    if any(s == "" for s in stops):
        raise bad_request("stop sequences must not be empty strings.", "stop", "invalid_value")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not -(2**63) <= seed < 2**64):
        raise bad_request(f"seed must be an integer in [-2**63, 2**64); got {seed!r:.60}.", "seed", "invalid_value")
    stream = body.get("stream")
    if stream not in (None, True, False):
        raise bad_request(f"stream must be true or false; got {stream!r:.60}.", "stream", "invalid_type")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("stream_options is only allowed with stream=true.", "stream_options", "invalid_value")
        if not isinstance(options, Mapping) or set(options) - {"include_usage"} or options.get("include_usage") not in (None, True, False):
            raise bad_request(f"stream_options must be {{\"include_usage\": true|false}}; got {options!r:.60}.", "stream_options", "invalid_value")
        include_usage = bool(options.get("include_usage"))
    return dict(
        model=model, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=most, min_tokens=least,
        n=1 if n is None else n, stop=stops, seed=None if seed is None else int(seed), stream=bool(stream), include_usage=include_usage,
    )


def _content(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content")
    where = f"messages[{index}].content"
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part_index, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise bad_request(f"{where}[{part_index}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported; got {kind!r:.40}.", "messages", "invalid_value")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"{where} must be a string or a list of text parts; got {type(content).__name__}.", "messages", "invalid_type")


def parse_chat_request(body: Any) -> ChatRequest:
    """A ``/v1/chat/completions`` body (a decoded JSON object) as a :class:`ChatRequest`;
    :class:`APIError` (400) naming the first wrong field."""
    settings = _sampling(body, _CHAT_KEYS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {\"role\", \"content\"} objects.", "messages", "missing_required_parameter" if messages is None else "invalid_value")
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise bad_request(f"messages[{index}] must be an object with role and content; got {type(message).__name__}.", "messages", "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise bad_request(f"messages[{index}].role must be one of {', '.join(ROLES)}; got {role!r:.40}.", "messages", "invalid_value")
        extra = set(message) - {"role", "content", "name"}
        if extra:
            raise bad_request(f"messages[{index}] has fields this server does not support: {', '.join(sorted(extra))}.", "messages", "unsupported_parameter")
        parsed.append({"role": ROLES[role], "content": _content(message, index)})
    return ChatRequest(messages=parsed, **settings)


def parse_completion_request(body: Any) -> CompletionRequest:
    """A ``/v1/completions`` body as a :class:`CompletionRequest`; :class:`APIError` (400)
    naming the first wrong field."""
    settings = _sampling(body, _COMPLETION_KEYS)
    prompt = body.get("prompt")
    wrong = bad_request("prompt must be a string, a list of strings, a list of token ids or a list of such lists (none empty).", "prompt", "missing_required_parameter" if prompt is None else "invalid_value")
    if isinstance(prompt, str):
        prompts: list[str | list[int]] = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) and p and all(_is_int(t) and t >= 0 for t in p) for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise wrong
    if len(prompts) * settings["n"] > MAX_N:
        raise bad_request(f"{len(prompts)} prompts x n={settings['n']} answers is more than {MAX_N} in one request.", "n", "invalid_value")
    return CompletionRequest(prompts=prompts, **settings)


# ---------------------------------------------------------------------------------------- responses


@dataclass(frozen=True)
class Choice:
    """One answer of a request."""

    index: int
    """Its position among the request's answers (prompt by prompt, ``n`` each)."""
    text: str
    """The answer's text (up to, not including, a stop string or the end token)."""
    finish_reason: str
    """``"stop"`` (the end token or a stop string) or ``"length"`` (``max_tokens`` reached)."""


@dataclass(frozen=True)
class Usage:
    """Token counts of a request."""

    prompt_tokens: int
    """The prompts' tokens (each prompt counted once, whatever ``n``)."""
    completion_tokens: int
    """Every answer's tokens."""

    def body(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": self.prompt_tokens + self.completion_tokens}


def chat_completion(request_id: str, model: str, choices: Sequence[Choice], usage: Usage, created: int | None = None) -> dict[str, Any]:
    """A whole ``chat.completion`` object."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": None, "finish_reason": c.finish_reason}
            for c in choices
        ],
        "usage": usage.body(),
    }


def completion(request_id: str, model: str, choices: Sequence[Choice], usage: Usage, created: int | None = None) -> dict[str, Any]:
    """A whole ``text_completion`` object."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [{"index": c.index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason} for c in choices],
        "usage": usage.body(),
    }


def chat_chunk(
    request_id: str, model: str, created: int, index: int, text: str | None = None, role: bool = False, finish_reason: str | None = None
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of a stream: the opening one (``role``), a piece of text, or
    the closing one (``finish_reason``, empty delta)."""
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def completion_chunk(request_id: str, model: str, created: int, index: int, text: str, finish_reason: str | None = None) -> dict[str, Any]:
    """One ``text_completion`` chunk of a stream."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }


def usage_chunk(request_id: str, model: str, created: int, usage: Usage, chat: bool = True) -> dict[str, Any]:
    """The last chunk of a stream with ``include_usage``: no choices, the token counts."""
    return {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage.body(),
    }


def model_list(names: Sequence[str], created: int = 0, owned_by: str = "llm_marl") -> dict[str, Any]:
    """The ``/v1/models`` answer: one entry per agent."""
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": owned_by} for name in names]}


def sse(data: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``data`` as JSON."""
    return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8") + b"\n\n"
