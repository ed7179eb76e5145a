"""Threads that behave under load (``llm_marl.cpu``, issue 32).

A passive OpenMP wait policy is in place before torch loads: the ``llm-marl`` command and
``import llm_marl`` set ``OMP_WAIT_POLICY=PASSIVE`` unless the user set a policy (checked in fresh
subprocesses, recording the variable at the moment torch is imported). Where torch came first, a
trainer takes as many threads as CPUs are free and says once what to set. ``--threads N`` and the
config field ``num_threads`` choose the count. The load and the CPUs are faked; nothing is timed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from llm_marl import cpu
from llm_marl.cli import main

REPO = Path(__file__).resolve().parents[1]

# Records OMP_WAIT_POLICY as it is when torch starts to load, then runs the code after it.
RECORDER = """
import os, sys
class Recorder:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "seen" not in os.environ:
            os.environ["seen"] = "1"
            print("at torch import:", os.environ.get("OMP_WAIT_POLICY", "<unset>"), flush=True)
        return None
sys.meta_path.insert(0, Recorder())
"""

TRAIN = ["train", "--env", "ClimbingGame-v0", "--policy", "tabular", "--num_turns", "1", "--max_steps", "1",
         "--eval_interval", "0", "--progress_bar", "false"]


def run_python(code: str, policy: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run([sys.executable, "-c", RECORDER + code], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_command_sets_a_passive_wait_policy_before_torch_loads(tmp_path):
    code = f"from llm_marl.cli import main; raise SystemExit(main({TRAIN + ['--output_dir', str(tmp_path / 'run')]!r}))"
    out = run_python(code)
    assert out.splitlines()[0] == "at torch import: PASSIVE", out
    assert "optimizer_steps" in (tmp_path / "run" / "summary.json").read_text()  # it did load torch and train


def test_the_command_keeps_a_policy_the_user_set():
    assert run_python("import llm_marl.cli; import torch", policy="ACTIVE").splitlines() == ["at torch import: ACTIVE"]


def test_the_library_sets_it_only_when_torch_is_not_yet_imported():
    assert run_python("import llm_marl; import torch").splitlines() == ["at torch import: PASSIVE"]
    out = run_python("import torch, os, llm_marl; print('after llm_marl:', os.environ.get('OMP_WAIT_POLICY', '<unset>'))")
    assert out.splitlines() == ["at torch import: <unset>", "after llm_marl: <unset>"]  # too late: left alone


@pytest.fixture
def machine(monkeypatch):
    """``machine(cpus, load, policy)``: a faked CPU set, 1-minute load and wait policy; torch
    gets as many threads as CPUs (restored afterwards), and the once-per-process line may be said again."""
    before = torch.get_num_threads()

    def fake(cpus: int, load: float, policy: str | None = None) -> None:
        monkeypatch.setattr(cpu, "_affinity", lambda: set(range(cpus)))
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        monkeypatch.setattr(cpu, "_STATE", {"set_passive": False})
        monkeypatch.setattr(cpu, "_WARNED", set())
        if policy is None:
            monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        else:
            monkeypatch.setenv("OMP_WAIT_POLICY", policy)
        torch.set_num_threads(cpus)

    yield fake
    torch.set_num_threads(before)


def said(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, cpu.CPUWarning)]


def test_spinning_threads_on_a_busy_machine_shrink_to_the_free_cpus_and_one_line_says_what_to_set(machine):
    machine(cpus=4, load=3.0)  # this process and two others busy
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cpu.configure_threads() == 2 and torch.get_num_threads() == 2
        torch.set_num_threads(4)
        assert cpu.configure_threads() == 2  # again, silently
    lines = said(caught)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "using 2 thread(s) instead of 4" in lines[0] and "set OMP_WAIT_POLICY=PASSIVE before torch loads" in lines[0]


@pytest.mark.parametrize("cpus,load,policy", [(4, 3.0, "PASSIVE"), (4, 1.0, None), (2, 0.2, None)])
def test_passive_threads_or_a_quiet_machine_keep_torchs_count_silently(cpus, load, policy, machine):
    machine(cpus=cpus, load=load, policy=policy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cpu.configure_threads() == cpus and torch.get_num_threads() == cpus
    assert said(caught) == []


def test_num_threads_is_exact_even_on_a_busy_spinning_machine_and_checked(machine):
    machine(cpus=2, load=9.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cpu.configure_threads(2) == 2 and torch.get_num_threads() == 2
    assert said(caught) == []
    with pytest.raises(ValueError, match="num_threads must be None or an int >= 1, got 0"):
        cpu.configure_threads(0)


def test_free_cpus_counts_the_others_load_and_keeps_one(machine):
    for cpus, load, free in [(2, 0.0, 2), (2, 1.0, 2), (2, 2.0, 1), (2, 6.0, 1), (8, 3.4, 6), (8, 3.6, 5)]:
        machine(cpus=cpus, load=load)
        assert cpu.free_cpus() == free, (cpus, load)


def test_threads_flag_and_num_threads_field_set_the_trainers_count(tmp_path, machine):
    from llm_marl import MAGRPOConfig

    machine(cpus=2, load=0.0)
    assert main([*TRAIN, "--threads", "1", "--output_dir", str(tmp_path / "a")]) == 0  # --threads is --num_threads
    assert torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="num_threads must be an int >= 1, got 0"):
        MAGRPOConfig(num_threads=0)
