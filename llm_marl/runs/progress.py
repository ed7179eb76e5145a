"""Progress of the phases a user waits through: fetching and converting a named model, building
the tiny model, each evaluation and training (the training bar lives in the trainer).

Two forms, both on stderr:

- :func:`bar`: a tqdm bar over a known count (pre-training steps, eval items) with its own
  estimate of the time left;
- :func:`phase`: a step with no count of its own (a ``pip download``, a GGUF conversion): one
  line saying what runs and how long it usually takes, a ticking elapsed time on a terminal, and
  one line with the time it took.

Whether they show: :func:`enabled` — on when stderr is a terminal, and always in the ``llm-marl``
command (:func:`enable`); a library user in a script sees them only on a terminal.

:func:`decode_step` is how a sampling loop reports its tokens (``step`` of ``total``) to whoever
listens (:func:`listening`): an evaluation turns them into fractions of the items in flight, so
its bar moves while one large batch decodes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Callable, Iterator

__all__ = ["Quiet", "bar", "decode_step", "enable", "enabled", "listening", "phase"]

_ENABLED: bool | None = None
_LISTENERS: list[Callable[[int, int], None]] = []


def enable(value: bool | None) -> bool | None:
    """Show progress (True), never (False), or on a terminal only (None, the default); returns the
    previous setting."""
    global _ENABLED
    previous, _ENABLED = _ENABLED, value
    return previous


def enabled() -> bool:
    """Whether progress shows now (see :func:`enable`)."""
    if _ENABLED is not None:
        return _ENABLED
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class Quiet:
    """Stands in for a bar when progress does not show."""

    n: float = 0
    total: float = 0

    def update(self, n: float = 1) -> None: ...
    def refresh(self) -> None: ...
    def set_postfix_str(self, text: str, refresh: bool = True) -> None: ...
    def close(self) -> None: ...


def bar(total: int, desc: str, unit: str, *, show: bool = True) -> Any:
    """A tqdm bar of ``total`` ``unit`` on stderr (a silent stand-in when ``show`` is False or
    progress is off)."""
    if not (show and enabled()):
        return Quiet()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5, file=sys.stderr)


def _seconds(value: float) -> str:
    value = int(round(value))
    return f"{value // 60} min {value % 60:02d} s" if value >= 60 else f"{value} s"


@contextlib.contextmanager
def phase(what: str, estimate: str, *, show: bool | None = None) -> Iterator[None]:
    """Announce ``what`` with its usual duration (``estimate``, e.g. "about 40 s on a 2-core CPU"),
    tick the elapsed seconds on a terminal, and say how long it took."""
    show = enabled() if show is None else show
    if not show:
        yield
        return
    started = time.perf_counter()
    stream = sys.stderr
    print(f"llm-marl: {what} ({estimate}) ...", file=stream, flush=True)
    stop = threading.Event()
    ticker = None
    if getattr(stream, "isatty", lambda: False)():

        def tick() -> None:
            while not stop.wait(1.0):
                print(f"\r  {_seconds(time.perf_counter() - started)} so far", end="", file=stream, flush=True)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
            print("\r", end="", file=stream)
    print(f"llm-marl: {what}: done in {_seconds(time.perf_counter() - started)}", file=stream, flush=True)


@contextlib.contextmanager
def listening(listener: Callable[[int, int], None]) -> Iterator[None]:
    """Call ``listener(step, total)`` for every decoded token step while the block runs."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def decode_step(step: int, total: int) -> None:
    """A sampling loop drew token ``step`` (1-based) of at most ``total``."""
    for listener in _LISTENERS:
        listener(step, total)
