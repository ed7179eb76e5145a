"""Speed claims name their CPU: every benchmark prints the machine (``benchmarks/machine.py``),
and ``benchmarks/under_load.py`` runs its worker beside the busy processes it asks for and
reports loaded/quiet. Nothing is timed here (the worker is faked)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(f"llm_marl_bench_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_every_benchmark_script_prints_the_machine():
    scripts = sorted(p.name for p in BENCHMARKS.glob("*.py")  # the scripts, not their helper modules
                     if p.name != "machine.py" and '__name__ == "__main__"' in p.read_text())
    assert "under_load.py" in scripts and "throughput.py" in scripts
    silent = [name for name in scripts if "print_machine()" not in (BENCHMARKS / name).read_text()
              and "machine.py" not in (BENCHMARKS / name).read_text()]
    assert silent == []


def test_the_machine_lines_name_the_cpu_its_flags_and_bf16(monkeypatch):
    machine = load("machine")
    from llm_marl import cpu

    monkeypatch.setattr(cpu, "cpu_model", lambda: "Faked EPYC 7B13")
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"sse2", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"}))
    monkeypatch.setattr(cpu, "bf16_support", lambda: cpu.Bf16Support(False, "this CPU lacks avx512bw"))
    info = machine.machine()
    assert info["flags"] == ["amx_tile", "avx2", "avx512_bf16", "avx512f"]
    first, second = machine.describe(info).splitlines()
    assert first.startswith("machine: Faked EPYC 7B13, ") and "flags: amx_tile avx2 avx512_bf16 avx512f;" in first
    assert first.endswith("oneDNN bf16 kernels: no (this CPU lacks avx512bw)")
    assert "torch " in second and "OMP_WAIT_POLICY=" in second and "load average" in second


def test_under_load_runs_each_worker_beside_the_busy_processes_asked_for(monkeypatch):
    bench = load("under_load")
    seen = []
    real_popen = subprocess.Popen

    def fake_run(command, env, **kwargs):
        spec = json.loads(command[-1])
        busy = [p for p in hogs if p.poll() is None]
        seen.append((spec["policy"], env.get("OMP_WAIT_POLICY"), env.get("GOMP_SPINCOUNT"), len(busy)))
        counts = [2, 1] if spec["policy"] == "adaptive" and busy else [2]
        row = {"seconds": 2.0 + len(busy), "cpu_seconds": 1.0, "steps": spec["steps"], "threads": counts[-1],
               "thread_counts": counts, "wait_policy": "x"}
        return subprocess.CompletedProcess(command, 0, stdout=json.dumps(row) + "\n", stderr="")

    hogs = []

    def popen(*args, **kwargs):
        hogs.append(real_popen(*args, **kwargs))
        return hogs[-1]

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setattr(bench.subprocess, "Popen", popen)
    ns = bench.argparse.Namespace(model="tiny", steps=1, threads=None, seed=0)
    rows = [bench.measure(policy, busy, ns) for policy in ("adaptive", "passive", "default") for busy in (0, 2)]
    assert seen == [("adaptive", None, None, 0), ("adaptive", None, None, 2), ("passive", "PASSIVE", None, 0),
                    ("passive", "PASSIVE", None, 2), ("default", None, None, 0), ("default", None, None, 2)]
    assert all(hog.poll() is not None for hog in hogs) and len(hogs) == 6  # every busy process is gone
    bench.measure("spin:10000", 0, ns)
    assert seen[-1] == ("spin:10000", None, "10000", 0)
    text = bench.table(rows, ["adaptive", "passive", "default"], 2)
    assert "| adaptive | 2.00 | 4.00 | 2.00x | 1.000 | 2; 2->1 |" in text
    assert "| passive | 2.00 | 4.00 | 2.00x | 1.000 | 2; 2 |" in text and "| default | 2.00 | 4.00 | 2.00x | 1.000 | 2; 2 |" in text
