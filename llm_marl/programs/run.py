"""One execution of a program: its worker thread, its pending calls and the step rule.

A :class:`ProgramRun` calls ``program(item, client)`` in a worker thread; ``client`` is an
``openai.OpenAI`` client (an ``openai.AsyncOpenAI`` client for an ``async def`` program, run on
an event loop of the worker's own) whose base URL is the run's own on the local
:class:`~llm_marl.programs.endpoint.Endpoint`, without retries. Each call the program makes
waits at the endpoint until :meth:`ProgramRun.answer` gives it a reply.

**The step rule: which calls are pending together.** The env waits (:meth:`ProgramRun.settle`)
until the program has finished, or it is *waiting on the endpoint alone*: every request the
given client has sent is held at the endpoint unanswered, at least one is, and (for an async
program) its event loop has nothing left to run. The calls held then are one step: the first
held call of each agent (in the order the program issued them) is that agent's observation; a second call of the same agent stays held
for the next step. So ``asyncio.gather`` of calls to two agents is one step of both, two calls
in sequence are two steps, and the grouping does not depend on timing. Two limits, documented in
docs/programs.md: an async program that sleeps (``asyncio.sleep``) counts as waiting, and calls
made through a client the program builds itself (from ``client.base_url``), or from threads of
its own, are grouped as they arrive.

Failures: a call refused by the endpoint (an unknown model, a bad parameter) marks the run
failed with that message (the program usually raises next, but the first message is kept); an
exception from the program does too. :meth:`cancel` ends a run: held calls are answered with a
503, an async program's task is cancelled, and the worker thread is joined.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import inspect
import selectors
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from llm_marl.programs.endpoint import CLIENT_HEADER, ORDER_HEADER, Endpoint


NO_DELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
# verify=False: the endpoint is plain HTTP on 127.0.0.1; a verifying transport loads the CA
# bundle for every run (tens of ms each).
"""Socket options of the handed clients: without TCP_NODELAY a call's request, written in two
pieces, waits for the server's delayed ACK (~40 ms a call on Linux)."""


class RunCancelled(Exception):
    """A held call of a run that was cancelled."""


@dataclass
class Call:
    """One call held at the endpoint."""

    agent: str
    """The call's ``model``."""
    observation: Any
    """Its messages (a chat call) or prompt (a completion call)."""
    future: concurrent.futures.Future
    """Resolved with the reply text by :meth:`ProgramRun.answer`."""
    ours: bool
    """Whether it came through the client the run handed the program."""
    order: float = float("inf")
    """Its rank in the order the program issued its calls (calls of other clients: after them, as they arrive)."""


def _read_platform_now(client: Any) -> None:
    """The async ``openai`` client reads its platform headers on a worker thread at its first
    requests (one thread per call sent together), so calls gathered together would resume, and
    be numbered, in the order those threads finish; read once here, they run in the program's
    order. (A client without that attribute is left as it is.)"""
    if getattr(client, "_platform", "absent") is None:
        from openai._base_client import get_platform

        client._platform = get_platform()


def is_async(program: Callable[..., Any]) -> bool:
    """Whether ``program`` is an ``async def`` function (or an object whose ``__call__`` is)."""
    return inspect.iscoroutinefunction(program) or inspect.iscoroutinefunction(getattr(program, "__call__", None))


class ProgramRun:
    """``program(item, client)`` running in a worker thread against ``endpoint``."""

    def __init__(self, program: Callable[..., Any], item: Any, agents: Sequence[str], endpoint: Endpoint, join_s: float = 10.0):
        self.program = program
        self.item = item
        self.agents = list(agents)
        self.is_async = is_async(program)
        self.join_s = join_s
        self._cond = threading.Condition()
        self.pending: list[Call] = []
        self._in_flight = 0  # requests the handed client has sent and not yet had answered
        self._held_ours = 0  # of those, the ones held at the endpoint
        self._issued = itertools.count()  # numbers the program's calls as it issues them
        self._idle = not self.is_async  # a sync program is blocked while its call is out
        self.done = False
        self.result: Any = None
        self.error: str | None = None
        self.cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._endpoint = endpoint
        self.base_url = endpoint.add(self)
        self._thread = threading.Thread(target=self._main, name="llm-marl-program", daemon=True)
        self._thread.start()

    # --- the env's side ------------------------------------------------------------------------

    def settle(self, timeout: float | None) -> bool:
        """Wait until the program has finished or waits on the endpoint alone (module docstring);
        False when ``timeout`` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(self._settled, timeout)

    def heads(self) -> dict[str, Any]:
        """The step's calls: each agent's first held call's observation, in agent order."""
        with self._cond:
            first: dict[str, Any] = {}
            for call in self.pending:
                first.setdefault(call.agent, call.observation)
            return {agent: first[agent] for agent in self.agents if agent in first}

    def answer(self, replies: Mapping[str, str]) -> None:
        """Answer each agent's first held call with its reply."""
        with self._cond:
            for agent, text in replies.items():
                call = next(c for c in self.pending if c.agent == agent)
                self.pending.remove(call)
                if call.ours:
                    self._held_ours -= 1
                call.future.set_result(text)
            self._cond.notify_all()

    def cancel(self) -> None:
        """End the run: held calls get a 503, an async task is cancelled, the thread is joined."""
        with self._cond:
            self.cancelled = True
            calls, self.pending, self._held_ours = self.pending, [], 0
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(RunCancelled())
            loop, task = self._loop, self._task
        self._endpoint.remove(self.base_url)
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has closed: the task is over
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(self.join_s)

    @property
    def alive(self) -> bool:
        """Whether the worker thread still runs."""
        return self._thread.is_alive()

    # --- the endpoint's side ---------------------------------------------------------------------

    def submit(self, agent: str, observation: Any, ours: bool, order: int | None = None) -> concurrent.futures.Future | None:
        """Hold a call until it is answered, among the held calls in the order the program issued
        them (``order``); None when the run has ended."""
        with self._cond:
            if self.cancelled or self.done:
                return None
            call = Call(agent, observation, concurrent.futures.Future(), ours, float("inf") if order is None else order)
            self.pending.append(call)
            self.pending.sort(key=lambda held: held.order)  # stable: unordered calls keep their arrival order
            if ours:
                self._held_ours += 1
            self._cond.notify_all()
            return call.future

    def fail(self, message: str) -> None:
        """Mark the run failed (the first message is kept)."""
        with self._cond:
            if self.error is None:
                self.error = message
            self._cond.notify_all()

    # --- the worker's side -----------------------------------------------------------------------

    def _settled(self) -> bool:
        return self.done or (bool(self.pending) and self._idle and self._in_flight == self._held_ours)

    def _count(self, delta: int) -> None:
        with self._cond:
            self._in_flight += delta
            self._cond.notify_all()

    def _set_idle(self, idle: bool) -> None:
        with self._cond:
            self._idle = idle
            if idle:
                self._cond.notify_all()

    def _main(self) -> None:
        try:
            result = self._run_async() if self.is_async else self._run_sync()
            with self._cond:
                self.result = result
        except BaseException as exc:  # noqa: BLE001 (the program's own error, reported by the env)
            with self._cond:
                if self.error is None and not self.cancelled:
                    detail = str(exc).splitlines()[0] if str(exc) else ""
                    self.error = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        finally:
            with self._cond:
                self.done = True
                self._cond.notify_all()

    def _stamp(self, request: Any) -> None:
        """Number a call as the program issues it (:data:`ORDER_HEADER`); called on the program's
        thread, before the request is sent."""
        request.headers[ORDER_HEADER] = str(next(self._issued))

    def _client_kwargs(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "api_key": "llm-marl", "max_retries": 0, "default_headers": {CLIENT_HEADER: "1"}}

    def _run_sync(self) -> Any:
        import httpx
        import openai

        run = self

        class Counting(httpx.HTTPTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                run._stamp(request)
                run._count(+1)
                try:
                    return super().handle_request(request)
                finally:
                    run._count(-1)

        with httpx.Client(transport=Counting(verify=False, socket_options=NO_DELAY), timeout=None) as http:
            client = openai.OpenAI(http_client=http, **self._client_kwargs())
            return self.program(self.item, client)

    def _run_async(self) -> Any:
        import httpx
        import openai

        run = self

        class Counting(httpx.AsyncHTTPTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                run._stamp(request)
                run._count(+1)
                try:
                    return await super().handle_async_request(request)
                finally:
                    run._count(-1)

        async def main() -> Any:
            async with httpx.AsyncClient(transport=Counting(verify=False, socket_options=NO_DELAY), timeout=None) as http:
                client = openai.AsyncOpenAI(http_client=http, **self._client_kwargs())
                _read_platform_now(client)
                return await self.program(self.item, client)

        loop = asyncio.SelectorEventLoop(_IdleSelector(self))
        try:
            with self._cond:
                if self.cancelled:
                    raise RunCancelled()
                self._loop = loop
                self._task = loop.create_task(main())
            return loop.run_until_complete(self._task)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                with self._cond:
                    self._loop = None
                loop.close()


class _IdleSelector(selectors.BaseSelector):
    """The worker loop's selector: tells the run when the loop has nothing to run (a ``select``
    that may block) and when it wakes."""

    def __init__(self, run: ProgramRun):
        self._inner = selectors.DefaultSelector()
        self._run = run

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:
            return self._inner.select(timeout)
        self._run._set_idle(True)
        try:
            return self._inner.select(timeout)
        finally:
            self._run._set_idle(False)

    def close(self) -> None:
        self._inner.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()
