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

**Threads.** On a machine where other processes compete for the cores, OpenMP's default
spin-waiting makes torch's threads burn their time slices waiting for each other: a training run
beside one busy process took 2.7x its quiet time, beside four 13-16x. A passive wait policy
(``OMP_WAIT_POLICY=PASSIVE``: a thread that waits sleeps) avoids that, but OpenMP reads it only
when torch loads. So the ``llm-marl`` command and ``import llm_marl`` set it when torch is not yet
imported (:func:`prefer_passive_wait`; never overriding a value the user set), and when torch
came first a trainer picks its thread count from the CPUs free at that moment and says once what
to set (:func:`configure_threads`). ``--threads N`` / config ``num_threads`` choose the count.

This module imports nothing from the package and loads torch only inside the functions that
need it, so the command can call it before torch loads.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import sys
import warnings
from typing import NamedTuple

__all__ = [
    "Bf16Support",
    "CPUWarning",
    "bf16_support",
    "configure_threads",
    "cpu_flags",
    "cpu_model",
    "free_cpus",
    "prefer_passive_wait",
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

WAIT_POLICY = "OMP_WAIT_POLICY"

_STATE = {"set_passive": False}


def prefer_passive_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` when torch is not imported yet and the user set no policy
    (OpenMP reads it once, when torch loads). Returns whether the passive policy is (or will be)
    in effect for this process's torch."""
    if "torch" not in sys.modules and WAIT_POLICY not in os.environ:
        os.environ[WAIT_POLICY] = "PASSIVE"
        _STATE["set_passive"] = True
    return passive_wait()


def passive_wait() -> bool:
    """Whether this process's OpenMP threads wait passively: the policy was PASSIVE when torch
    loaded (set by the user, or by :func:`prefer_passive_wait` before torch loaded)."""
    if _STATE["set_passive"]:
        return True
    return os.environ.get(WAIT_POLICY, "").strip().upper() == "PASSIVE"


def _affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


def free_cpus() -> int:
    """CPUs this process may use that other work does not keep busy: the usable CPUs minus the
    1-minute load average beyond this process's own one (at least 1)."""
    usable = len(_affinity())
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return usable
    others = max(0.0, load - 1.0)
    return max(1, min(usable, math.floor(usable - others + 0.5)))


def configure_threads(num_threads: int | None = None) -> int:
    """Set torch's intra-op thread count for a run and return it.

    ``num_threads`` given: exactly that many. None: torch's count, except where torch's threads
    spin while waiting (the wait policy was not passive when torch loaded) and fewer CPUs are
    free than it has threads: then as many as are free, and one line, once, says what to set."""
    import torch

    if num_threads is not None:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be None or an int >= 1, got {num_threads!r}")
        if torch.get_num_threads() != num_threads:
            torch.set_num_threads(num_threads)
        return num_threads
    current = torch.get_num_threads()
    if passive_wait() or current <= 1:
        return current
    free = free_cpus()
    if free >= current:
        return current
    torch.set_num_threads(free)
    if "threads" not in _WARNED:
        _WARNED.add("threads")
        warnings.warn(
            f"torch was imported before llm_marl without {WAIT_POLICY}=PASSIVE, so its threads spin while waiting; "
            f"{free} of {len(_affinity())} CPUs are free (load {os.getloadavg()[0]:.1f}): using {free} thread(s) instead of "
            f"{current}; set {WAIT_POLICY}=PASSIVE before torch loads, or num_threads (--threads N), to choose",
            CPUWarning,
            stacklevel=2,
        )
    return free
