"""Threads that behave under load (``llm_marl.cpu``, ``llm_marl.threads``, issue 32).

llm_marl sets no OpenMP wait policy (checked in fresh subprocesses, recording the variable at the
moment torch is imported): torch's threads spin, and a trainer keeps their count equal to the CPUs
other work leaves free, measured from /proc over intervals. /proc, the clock and the CPU set are
faked here, so the governor's decisions are exact; nothing is timed. ``--threads N``, the config
field ``num_threads``, ``OMP_NUM_THREADS`` and a count set by the user are left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from llm_marl import cpu, threads
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


# --- the wait policy: OpenMP's, or the user's ------------------------------------------------------


def test_the_command_sets_no_wait_policy_before_torch_loads(tmp_path):
    code = f"from llm_marl.cli import main; raise SystemExit(main({TRAIN + ['--output_dir', str(tmp_path / 'run')]!r}))"
    out = run_python(code)
    assert out.splitlines()[0] == "at torch import: <unset>", out
    assert "optimizer_steps" in (tmp_path / "run" / "summary.json").read_text()  # it did load torch and train


def test_the_command_and_the_library_keep_a_policy_the_user_set():
    assert run_python("import llm_marl.cli; import torch", policy="PASSIVE").splitlines() == ["at torch import: PASSIVE"]
    assert run_python("import llm_marl; import torch").splitlines() == ["at torch import: <unset>"]


# --- the governor's arithmetic, on a faked /proc and clock -----------------------------------------


class FakeProc:
    """A faked /proc/stat, /proc/self/stat and clock: every clock read is ``step`` seconds later,
    during which other work used ``others`` CPUs and this process ``own``."""

    def __init__(self, others: float = 0.0, own: float = 0.0, step: float = 1.0):
        self.others, self.own, self.step = others, own, step
        self.now = 0.0
        self.busy = self.own_ticks = 0.0
        self.reads = 0
        self.hz = threads._ticks_per_second()

    def clock(self) -> float:
        self.now += self.step
        self.busy += (self.others + self.own) * self.hz * self.step
        self.own_ticks += self.own * self.hz * self.step
        return self.now

    def read(self, cpus) -> tuple[int, int]:
        assert list(cpus) == [0, 1]
        self.reads += 1
        return round(self.busy), round(self.own_ticks)


@pytest.fixture
def two_threads():
    """Torch with 2 threads during the test; its count, and no governor, afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    threads.stop()
    torch.set_num_threads(before)


@pytest.mark.parametrize("usable,others,ceiling,want", [
    (2, 0.0, 2, 2), (2, 0.39, 2, 2), (2, 0.4, 2, 1), (2, 0.67, 2, 1), (2, 1.0, 2, 1), (2, 1.6, 2, 1),
    (8, 2.5, 4, 4), (8, 5.0, 8, 3), (4, 1.4, 4, 2), (1, 0.0, 1, 1),
])
def test_free_threads_are_the_cpus_others_leave_at_least_one_at_most_the_ceiling(usable, others, ceiling, want):
    assert threads.free_threads(usable, others, ceiling) == want


def test_a_busy_neighbour_takes_one_thread_away_and_its_end_gives_it_back(two_threads):
    fake = FakeProc(others=0.67, own=1.3)  # our 2 spinning threads leave the busy one 2/3 of a CPU
    governor = threads.ThreadGovernor(2, [0, 1], read=fake.read, clock=fake.clock)
    assert [governor.tick(), governor.tick()] == [2, 1]  # the second check in a row that says 1
    assert torch.get_num_threads() == 1 and governor.others == pytest.approx(0.67, abs=0.01)
    fake.others, fake.own = 1.0, 1.0  # at 1 thread it gets a whole CPU: we stay at 1
    assert [governor.tick() for _ in range(5)] == [1] * 5
    fake.others, fake.own = 0.0, 1.0  # it ended (our own CPU time is not counted as others')
    assert [governor.tick(), governor.tick()] == [1, 2]
    assert torch.get_num_threads() == 2
    assert [(count, round(others, 2)) for _, count, others in governor.changes] == [(1, 0.67), (2, 0.0)]


def test_one_noisy_interval_changes_nothing(two_threads):
    fake = FakeProc(others=0.0, own=2.0)
    governor = threads.ThreadGovernor(2, [0, 1], read=fake.read, clock=fake.clock)
    counts = []
    for others in (0.9, 0.0, 0.9, 0.1, 0.7, 0.0):  # never the same new count twice in a row
        fake.others = others
        counts.append(governor.tick())
    assert counts == [2] * 6 and torch.get_num_threads() == 2 and not governor.changes


def test_between_checks_a_tick_reads_nothing(two_threads):
    fake = FakeProc(others=1.0, step=0.25)
    governor = threads.ThreadGovernor(2, [0, 1], read=fake.read, clock=fake.clock)
    assert fake.reads == 1  # the starting reading
    for _ in range(3):
        governor.tick()  # 0.25, 0.5, 0.75 s after it
    assert fake.reads == 1
    governor.tick()  # 1 s: a check
    assert fake.reads == 2 and governor.others == pytest.approx(1.0, abs=0.02)


def test_the_first_check_against_a_reading_from_before_the_models_loaded_acts_at_once(monkeypatch, two_threads):
    fake = FakeProc(others=0.67, own=1.0)
    monkeypatch.setattr(threads, "read_ticks", fake.read)
    monkeypatch.setattr(threads, "monotonic", fake.clock)
    monkeypatch.setattr(threads, "_FIRST", (fake.clock(), [0, 1], fake.read([0, 1])))  # 1 s before the start
    governor = threads.start(2, [0, 1])
    assert governor.threads == 1 and torch.get_num_threads() == 1 and governor.others == pytest.approx(0.67, abs=0.01)
    assert threads._FIRST is None  # used once: a later governor's first check would span the whole run
    torch.set_num_threads(2)
    recent = FakeProc(others=0.67, own=1.0, step=0.5)  # half a second old: too short an interval to act on
    governor = threads.ThreadGovernor(2, [0, 1], read=recent.read, clock=recent.clock,
                                      baseline=(recent.clock(), recent.read([0, 1])))
    assert governor.threads == 2 and governor.others is None and torch.get_num_threads() == 2


def test_a_tick_from_another_thread_does_nothing(two_threads):
    fake = FakeProc(others=1.0)
    governor = threads.ThreadGovernor(2, [0, 1], read=fake.read, clock=fake.clock)
    worker = threading.Thread(target=lambda: [governor.tick() for _ in range(3)])  # e.g. a backward pool's
    worker.start()
    worker.join()
    assert fake.reads == 1 and governor.active and torch.get_num_threads() == 2
    assert [governor.tick(), governor.tick()] == [2, 1]  # its own thread's ticks act


def test_a_count_someone_else_sets_mid_run_ends_the_governing(two_threads):
    fake = FakeProc(others=0.0, own=1.0)
    governor = threads.ThreadGovernor(2, [0, 1], read=fake.read, clock=fake.clock)
    torch.set_num_threads(1)  # the user's own choice
    assert [governor.tick() for _ in range(3)] == [2, 2, 2] and not governor.active
    assert torch.get_num_threads() == 1  # not raised back to the CPUs free


# --- /proc --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc")
def test_read_ticks_counts_this_process_cpu_time_inside_the_cpus_busy_time():
    cpus = sorted(os.sched_getaffinity(0))
    before = threads.read_ticks(cpus)
    spent = time.process_time()
    while time.process_time() - spent < 0.5:  # burn 0.5 s of CPU
        pass
    after = threads.read_ticks(cpus)
    busy, own = (a - b for a, b in zip(after, before))
    # /proc/stat samples CPUs per tick while a process's own time is exact, so under load the two
    # disagree by a few ticks: the margins catch a wrong field (idle read as busy, own time missed),
    # not rounding
    assert own >= 0.4 * threads._ticks_per_second() and busy >= 0.5 * own


def test_without_proc_the_count_stays_as_it_is(monkeypatch, two_threads):
    def missing(*args, **kwargs):
        raise FileNotFoundError("/proc/stat")

    monkeypatch.setattr(threads, "open", missing, raising=False)
    assert threads.read_ticks([0, 1]) is None
    assert threads.start(2, [0, 1]) is None and threads.current() is None
    fake = FakeProc(others=1.0)
    governor = threads.ThreadGovernor(2, [0, 1], read=fake.read, clock=fake.clock)
    monkeypatch.setattr(governor, "_read", lambda cpus: None)  # /proc goes away mid-run
    assert [governor.tick() for _ in range(3)] == [2, 2, 2] and not governor.active
    assert torch.get_num_threads() == 2


# --- configure_threads and the trainers ----------------------------------------------------------------


@pytest.fixture
def machine(monkeypatch, two_threads):
    """A 2-CPU machine whose torch picked 2 threads by itself; ``machine(others)`` fakes /proc and
    the clock (other work using ``others`` CPUs, this process one); returns the FakeProc."""
    monkeypatch.setattr(cpu, "_affinity", lambda: {0, 1})
    monkeypatch.setattr(cpu, "default_counts", lambda: {2})
    monkeypatch.setattr(threads, "_FIRST", None)  # the import-time reading was taken from the real /proc
    for name in cpu.COUNT_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def fake(others: float) -> FakeProc:
        proc = FakeProc(others=others, own=1.0)
        monkeypatch.setattr(threads, "read_ticks", proc.read)
        monkeypatch.setattr(threads, "monotonic", proc.clock)
        return proc

    return fake


def test_a_trainer_run_beside_a_busy_process_drops_to_one_thread(machine, monkeypatch, tmp_path):
    machine(others=0.67)
    calls = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n))[1])
    assert main([*TRAIN, "--max_steps", "3", "--output_dir", str(tmp_path / "run")]) == 0
    governor = threads.current()
    assert governor is not None and [count for _, count, _ in governor.changes] == [1]
    assert calls == [1] and torch.get_num_threads() == 1  # set by the governor, at an optimizer step
    machine(others=0.0)  # the next trainer in this process starts from torch's own count again
    assert cpu.configure_threads() == 2 and torch.get_num_threads() == 2
    assert threads.current() is not governor and threads.current().ceiling == 2


@pytest.mark.parametrize("how", ["num_threads", "OMP_NUM_THREADS", "torch.set_num_threads"])
def test_a_fixed_count_is_not_governed(how, machine, monkeypatch):
    machine(others=1.0)
    if how == "OMP_NUM_THREADS":
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
    if how == "torch.set_num_threads":
        torch.set_num_threads(3)  # not a count torch picks by itself here
    expected = 3 if how == "torch.set_num_threads" else 2
    assert cpu.count_fixed(torch.get_num_threads()) == (None if how == "num_threads" else how)
    assert cpu.configure_threads(2 if how == "num_threads" else None) == expected
    assert threads.current() is None and torch.get_num_threads() == expected
    threads.tick()
    assert torch.get_num_threads() == expected


def test_configure_threads_starts_a_governor_only_for_torchs_own_count_and_checks_num_threads(machine):
    machine(others=0.0)
    assert cpu.configure_threads() == 2 and threads.current() is not None
    assert cpu.configure_threads(1) == 1 and threads.current() is None  # a fixed count replaces it
    with pytest.raises(ValueError, match="num_threads must be None or an int >= 1, got 0"):
        cpu.configure_threads(0)


def test_threads_flag_and_num_threads_field_set_the_trainers_count(tmp_path, machine):
    from llm_marl import MAGRPOConfig

    machine(others=0.0)
    assert main([*TRAIN, "--threads", "1", "--output_dir", str(tmp_path / "a")]) == 0  # --threads is --num_threads
    assert torch.get_num_threads() == 1 and threads.current() is None
    with pytest.raises(ValueError, match="num_threads must be an int >= 1, got 0"):
        MAGRPOConfig(num_threads=0)


def test_the_samplers_decoding_loop_ticks_once_per_token(tmp_path, monkeypatch):
    from llm_marl.policies import CausalLMPolicy
    from llm_marl.policies.tiny import build_tiny_model

    class Counter:
        ticks = 0

        def tick(self) -> int:
            self.ticks += 1
            return 1

    counter = Counter()
    policy = CausalLMPolicy.from_pretrained(build_tiny_model(tmp_path / "m", pretrain_steps=0), max_new_tokens=5,
                                            min_new_tokens=5)
    monkeypatch.setattr(threads, "_GOVERNOR", counter)
    policy.sample(["A"], 2)
    assert counter.ticks == 5
