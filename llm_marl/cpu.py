"""What this machine's CPU runs, and how torch's threads share it.

**bf16 kernels.** oneDNN's bf16 kernels — the packed bf16 linears of
:mod:`~llm_marl.policies.packed_weights` and torch's fast bf16 matmul — run only on CPUs with
avx512bw, avx512vl and avx512dq, or avx_ne_convert; on others (an AVX2-only laptop or server)
oneDNN refuses at run time ("bf16 path needs the cpu support ...") and torch's bf16 matmul
falls back to a generic loop (ten 512x512 products: 1.25 s in bf16 against 0.04 s in float32,
measured with oneDNN limited to AVX2 by ``ONEDNN_MAX_CPU_ISA=AVX2``). :func:`bf16_support` asks the
hardware through oneDNN (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``, which also honours
``ONEDNN_MAX_CPU_ISA``) and names the CPU flags that are missing. Where the kernels do not run,
bf16 layers are not packed (they run unpacked: the same results) and bf16 models still run —
the request keeps its meaning — with one line, once, saying so and why (:func:`warn_bf16_fallback`).

**Threads.** OpenMP's default wait policy makes torch's threads spin while they wait for each
other: the fastest choice on a quiet machine, but beside other busy processes the spinning
threads lose their CPUs to them (a training run beside one busy process took 2.7x its quiet
time, beside four 13-16x). A passive policy (``OMP_WAIT_POLICY=PASSIVE``: a waiting thread sleeps)
avoids that but cost a quiet machine a third. So llm_marl leaves the wait policy to OpenMP (or
to the user: it never sets one) and instead keeps torch's thread count equal to the CPUs other
work leaves free, re-measured while a run goes (:func:`configure_threads`, :mod:`llm_marl.threads`):
a team of one thread never waits. ``--threads N`` / config ``num_threads`` (or
``OMP_NUM_THREADS``) fix the count instead; on a shared machine, pair a fixed count with
``OMP_WAIT_POLICY=PASSIVE``.

This module imports nothing at module level but the standard library (torch and
:mod:`llm_marl.threads` only inside the functions that need them), so it loads without torch.
"""

from __future__ import annotations

import functools
import os
import platform
import warnings
from typing import NamedTuple

__all__ = [
    "Bf16Support",
    "CPUWarning",
    "bf16_support",
    "configure_threads",
    "count_fixed",
    "cpu_flags",
    "cpu_model",
    "default_counts",
    "relevant_flags",
    "warn_bf16_fallback",
]

ONEDNN_BF16_FLAGS = ("avx512bw", "avx512vl", "avx512dq")
"""oneDNN's bf16 path needs all of these ... (x86)."""

ONEDNN_BF16_ALTERNATIVE = "avx_ne_convert"
"""... or this one (x86)."""


class CPUWarning(UserWarning):
    """Something this CPU cannot run as asked, and what runs instead."""


# --- what the CPU is -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _cpuinfo() -> dict[str, str]:
    """The first processor's ``key: value`` lines of /proc/cpuinfo ({} where there is none)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    if info:
                        break
                    continue
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's ``model name``; else what :mod:`platform` says)."""
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo's ``flags``, or ``Features`` on ARM; empty where unknown)."""
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def relevant_flags(flags: frozenset[str] | None = None) -> list[str]:
    """The flags that decide CPU speed claims here: avx2, avx512*, amx*, avx_ne_convert,
    avx_vnni* and anything naming bf16, sorted."""
    flags = cpu_flags() if flags is None else flags
    return sorted(
        f for f in flags
        if f == "avx2" or f.startswith(("avx512", "amx", "avx_vnni", "avx_ne_convert")) or "bf16" in f
    )


# --- bf16 --------------------------------------------------------------------------------------------


class Bf16Support(NamedTuple):
    """Whether oneDNN's bf16 kernels (packed bf16 linears, fast bf16 matmul) run on this CPU."""

    runs: bool
    reason: str
    """Why not (naming the CPU flags it lacks); "" when they run."""


@functools.lru_cache(maxsize=None)
def bf16_support() -> Bf16Support:
    """Ask the hardware (through oneDNN) whether its bf16 kernels run here; tests fake the answer
    by replacing this function (``monkeypatch.setattr(llm_marl.cpu, "bf16_support", ...)``)."""
    import torch

    try:
        runs = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # pragma: no cover - a torch built without oneDNN
        return Bf16Support(False, "this torch is built without oneDNN")
    if runs:
        return Bf16Support(True, "")
    flags = cpu_flags()
    missing = [f for f in ONEDNN_BF16_FLAGS if f not in flags]
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if flags and missing and ONEDNN_BF16_ALTERNATIVE not in flags:
        reason = (
            f"this CPU ({cpu_model()}) lacks {', '.join(missing)} and {ONEDNN_BF16_ALTERNATIVE} "
            f"(oneDNN's bf16 kernels need {', '.join(ONEDNN_BF16_FLAGS)}, or {ONEDNN_BF16_ALTERNATIVE})"
        )
    elif limit:
        reason = f"oneDNN is limited to {limit} by ONEDNN_MAX_CPU_ISA"
    else:
        reason = f"oneDNN says its bf16 kernels do not run on this CPU ({cpu_model()}, {platform.machine()})"
    return Bf16Support(False, reason)


_WARNED: set[str] = set()


def warn_bf16_fallback(what: str) -> None:
    """Say once per process, where bf16 is used on a CPU whose oneDNN bf16 kernels do not run,
    what runs instead (``what`` names the user of bf16, for the message)."""
    support = bf16_support()
    if support.runs or "bf16" in _WARNED:
        return
    _WARNED.add("bf16")
    warnings.warn(
        f"{what} in bfloat16 on a CPU without oneDNN's bf16 kernels ({support.reason}): bf16 layers run "
        "unpacked, through torch's generic bf16 matmul (same results, several times slower than float32 here)",
        CPUWarning,
        stacklevel=3,
    )


# --- threads -----------------------------------------------------------------------------------------

COUNT_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Environment variables that fix torch's thread count (torchrun sets OMP_NUM_THREADS per rank)."""


def _affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


def _physical_cores() -> int | None:
    """Distinct (physical id, core id) pairs of /proc/cpuinfo (None where it does not say)."""
    cores = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            package = None
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    package = value.strip()
                elif key == "core id":
                    cores.add((package, value.strip()))
    except OSError:
        return None
    return len(cores) or None


def default_counts() -> set[int]:
    """The counts torch picks by itself when nothing fixes one: a thread per physical core, per
    CPU, or per usable CPU (which one depends on torch's build)."""
    return {n for n in (_physical_cores(), os.cpu_count(), len(_affinity())) if n}


def count_fixed(current: int) -> str | None:
    """What fixed torch's count ``current`` (an environment variable, or a count torch did not pick
    by itself: ``torch.set_num_threads`` was called), or None."""
    for name in COUNT_VARIABLES:
        if os.environ.get(name, "").strip():
            return name
    if current not in default_counts():
        return "torch.set_num_threads"
    return None


def configure_threads(num_threads: int | None = None) -> int:
    """Set torch's intra-op thread count for a run and return it.

    ``num_threads`` given: exactly that many. None: torch's count now, kept equal to the CPUs that
    other work leaves free while the run goes (:mod:`llm_marl.threads`), unless something fixed it
    (:func:`count_fixed`): then exactly that count."""
    import torch

    from llm_marl import threads

    previous = threads.stop()
    if previous is not None and torch.get_num_threads() == previous.threads != previous.ceiling:
        torch.set_num_threads(previous.ceiling)  # the count torch had before an earlier run's governor lowered it
    if num_threads is not None:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be None or an int >= 1, got {num_threads!r}")
        if torch.get_num_threads() != num_threads:
            torch.set_num_threads(num_threads)
        return num_threads
    current = torch.get_num_threads()
    if current > 1 and count_fixed(current) is None:
        threads.start(current, sorted(_affinity()))
    return current
