"""Torch's thread count kept to the CPUs that other work leaves free, while a run goes (issue 32).

OpenMP's default wait policy makes torch's threads spin while they wait for each other: the
fastest choice on a quiet machine, and a disaster beside other busy processes, which take the
spinning threads' CPUs away from them (2 threads beside one busy process on 2 cores: ~3x the
quiet time). A team of one thread never waits for another, so instead of making threads sleep
(``OMP_WAIT_POLICY=PASSIVE``, which costs a quiet machine a wake-up after every wait), a
:class:`ThreadGovernor` keeps torch's intra-op count equal to the CPUs other work leaves free:

- ``others``, in CPUs, is the busy time of the CPUs this process may use (``/proc/stat``, per CPU)
  minus this process's own (``/proc/self/stat``: all its threads), over the time since the last
  check; a check happens at a :func:`tick` (each decoding step of the sampler, each optimizer
  step) at most every :data:`INTERVAL` seconds;
- the count it wants is :func:`free_threads`: the usable CPUs minus the ones others take (a CPU
  counts as taken from :data:`TAKEN_AT` of one), at least 1, at most the count it started with;
- a new count must come out of two checks in a row before it is set (one noisy interval changes
  nothing), except at the first check, made when the first trainer starts, against a reading
  taken when this module was imported (before the models loaded): its count is set at once, so a
  run beside busy processes does not start with seconds of spinning. Two spinning threads beside
  one busy process still leave it ~0.67 of a CPU, so it is seen; at one thread it gets a whole CPU
  and the count stays 1; when it ends the count goes back.

:func:`llm_marl.cpu.configure_threads` starts one for a trainer unless the count is fixed (the
trainer's ``num_threads``, ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the environment — torchrun
sets it per rank — or a count torch did not choose by itself); it stops governing as soon as
something else changes torch's count, and where ``/proc`` cannot be read it leaves the count alone.
It acts only in the thread that started it (OpenMP's count is per thread).
A governed run's thread count follows the machine's load, so its float results are not
bit-for-bit repeatable across runs: fix ``num_threads`` for that.
"""

from __future__ import annotations

import collections
import os
import threading
from time import monotonic
from typing import Callable, Sequence

__all__ = ["INTERVAL", "TAKEN_AT", "ThreadGovernor", "current", "free_threads", "read_ticks", "start", "stop", "tick"]

INTERVAL = 1.0
"""Seconds between two checks, at least."""

TAKEN_AT = 0.4
"""The share of a CPU other work must use for the CPU to count as taken."""

Reading = tuple[int, int]
"""(busy clock ticks of the usable CPUs, this process's clock ticks) since boot."""


def read_ticks(cpus: Sequence[int]) -> Reading | None:
    """Busy clock ticks of ``cpus`` (``/proc/stat``: user, nice, system, irq, softirq, steal) and
    this process's own (``/proc/self/stat``: utime + stime of all its threads); None where /proc
    cannot be read (not Linux)."""
    wanted = {f"cpu{c}" for c in cpus}
    try:
        busy = 0
        with open("/proc/stat", encoding="ascii") as stat:
            for line in stat:
                name, _, values = line.partition(" ")
                if name in wanted:
                    v = [int(x) for x in values.split()]
                    busy += v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
        with open("/proc/self/stat", encoding="ascii") as own_stat:
            fields = own_stat.read().rpartition(")")[2].split()
        own = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (OSError, ValueError, IndexError):
        return None
    return busy, own


def _ticks_per_second() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not Unix
        return 100.0


def free_threads(usable: int, others: float, ceiling: int) -> int:
    """Threads for ``usable`` CPUs of which other work uses ``others`` (in CPUs): the CPUs it does
    not take, at least 1, at most ``ceiling``."""
    taken = int(round(others + 1.0 - TAKEN_AT, 9))  # round: 0.4 + 0.6 is 0.999... in floats
    return max(1, min(ceiling, usable - taken))


class ThreadGovernor:
    """Sets torch's intra-op thread count to :func:`free_threads` as other work comes and goes.

    ``ceiling``: the most threads (the count torch had); ``cpus``: the CPUs this process may use.
    ``read`` and ``clock`` default to :func:`read_ticks` and :func:`time.monotonic` (tests fake them).
    ``baseline``: an earlier ``(clock, reading)``; at least :attr:`interval` old, the first check
    is made against it at once, and its count set at once.
    ``active`` is False once it has stopped governing (``/proc`` unreadable, or something else
    changed torch's count)."""

    def __init__(
        self,
        ceiling: int,
        cpus: Sequence[int],
        *,
        interval: float = INTERVAL,
        read: Callable[[Sequence[int]], Reading | None] | None = None,
        clock: Callable[[], float] | None = None,
        baseline: tuple[float, Reading] | None = None,
    ) -> None:
        self.ceiling, self.cpus, self.interval = ceiling, list(cpus), interval
        self._read = read or read_ticks
        self._clock = clock or monotonic
        self._hz = _ticks_per_second()
        self.threads = ceiling
        """The count it last set (or found)."""
        self.others: float | None = None
        """Other work's CPU use at the last check, in CPUs."""
        self.changes: collections.deque[tuple[float, int, float]] = collections.deque(maxlen=64)
        """The latest changes: (clock, new count, others)."""
        self._pending: int | None = None
        self._owner = threading.get_ident()  # torch's count is per OpenMP thread: only this one's
        now, reading = self._clock(), self._read(self.cpus)
        self._since, self._last = now, reading
        self.active = reading is not None and ceiling > 1
        if self.active and baseline is not None and now - baseline[0] >= interval:
            # an earlier reading (the process's first): check against it now, and act at once
            self._since, self._last = baseline
            self._check(now, reading, at_once=True)

    def tick(self) -> int:
        """Check, if :attr:`interval` has passed since the last check, and change the count if two
        checks in a row ask for the same new one; returns the count. Cheap between checks; does
        nothing in a thread other than the one that made the governor (OpenMP's count is per
        thread)."""
        if not self.active or threading.get_ident() != self._owner:
            return self.threads
        now = self._clock()
        if now - self._since < self.interval:
            return self.threads
        import torch

        reading = self._read(self.cpus)
        if reading is None or torch.get_num_threads() != self.threads:
            self.active = False  # /proc went away, or the count is someone else's now
            return self.threads
        self._check(now, reading)
        return self.threads

    def _check(self, now: float, reading: Reading, at_once: bool = False) -> None:
        import torch

        busy, own = (new - old for new, old in zip(reading, self._last))
        elapsed = now - self._since
        self._last, self._since = reading, now
        self.others = max(0.0, (busy - own) / self._hz / elapsed)
        wanted = free_threads(len(self.cpus), self.others, self.ceiling)
        if wanted == self.threads:
            self._pending = None
        elif at_once or wanted == self._pending:
            torch.set_num_threads(wanted)
            self.threads, self._pending = wanted, None
            self.changes.append((now, wanted, self.others))
        else:
            self._pending = wanted


def _usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return []


def _first_reading() -> tuple[float, list[int], Reading] | None:
    cpus = _usable_cpus()
    reading = read_ticks(cpus) if cpus else None
    return None if reading is None else (monotonic(), cpus, reading)


_FIRST = _first_reading()
"""(clock, CPUs, reading) when this module was imported (before any model loaded): the first
governor's first check measures against it, so that it can act at once."""

_GOVERNOR: ThreadGovernor | None = None
_HOOKED: list[bool] = []


def start(ceiling: int, cpus: Sequence[int]) -> ThreadGovernor | None:
    """Govern torch's count from now on (replacing any governor), checking at every :func:`tick`
    and every optimizer step (a global post-step hook); None where it cannot (one thread, or /proc
    unreadable: the count stays as it is)."""
    global _GOVERNOR, _FIRST
    first, _FIRST = _FIRST, None
    baseline = (first[0], first[2]) if first is not None and first[1] == list(cpus) else None
    governor = ThreadGovernor(ceiling, cpus, baseline=baseline)
    _GOVERNOR = governor if governor.active else None
    if _GOVERNOR is not None and not _HOOKED:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(lambda optimizer, args, kwargs: tick())
        _HOOKED.append(True)
    return _GOVERNOR


def stop() -> ThreadGovernor | None:
    """Stop governing (the count stays where it is); returns the governor that was at work."""
    global _GOVERNOR
    previous, _GOVERNOR = _GOVERNOR, None
    return previous


def current() -> ThreadGovernor | None:
    """The governor at work, if any."""
    return _GOVERNOR


def tick() -> None:
    """Let the governor at work, if any, check (the trainers' loops call this often; it costs a
    clock read between checks)."""
    if _GOVERNOR is not None:
        _GOVERNOR.tick()
