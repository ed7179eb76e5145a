"""The machine a benchmark ran on, printed with its results: speed claims name their CPU.

Every script in benchmarks/ calls :func:`print_machine` when it starts (and puts :func:`machine`
into its JSON where it writes one): the CPU model, how many CPUs the process may use, the flags
speed depends on here (avx2, avx512*, amx*, avx_vnni*, avx_ne_convert and anything naming bf16),
whether oneDNN's bf16 kernels run (``llm_marl.cpu.bf16_support``: no packed bf16 linears and a
slow generic bf16 matmul where they do not), torch's version and CPU capability, the OpenMP wait
policy and thread count, and the load average at that moment. The asking is done by
:mod:`llm_marl.cpu`; this is the one place the benchmarks format it.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's llm_marl


def machine() -> dict:
    """The machine as a JSON-ready dict (loads torch)."""
    import torch

    from llm_marl import cpu

    support = cpu.bf16_support()
    return {
        "cpu": cpu.cpu_model(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "flags": cpu.relevant_flags(),
        "onednn_bf16": support.runs,
        "onednn_bf16_reason": support.reason,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "<unset>"),
        "torch_threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def describe(info: dict | None = None) -> str:
    """Two lines: the CPU and its flags; torch, threads and load."""
    info = machine() if info is None else info
    bf16 = "yes" if info["onednn_bf16"] else f"no ({info['onednn_bf16_reason']})"
    return (
        f"machine: {info['cpu']}, {info['usable_cpus']} usable CPUs; flags: {' '.join(info['flags']) or '(no avx2/avx512/amx/bf16)'}; "
        f"oneDNN bf16 kernels: {bf16}\n"
        f"machine: torch {info['torch']} (CPU capability {info['cpu_capability']}), {info['torch_threads']} threads, "
        f"OMP_WAIT_POLICY={info['omp_wait_policy']}, load average {info['load_average']}"
    )


def print_machine(file=None) -> dict:
    """Print :func:`describe` (to stdout unless ``file``) and return the dict."""
    info = machine()
    print(describe(info), file=file or sys.stdout, flush=True)
    return info


if __name__ == "__main__":
    print_machine()
