"""The sandbox contains hostile programs: each ends as a failed result with a reason, the test
process is unaffected and no process is left behind.

Every sandboxed program here carries a unique marker in its environment; after each run the
test scans /proc for processes whose environment still holds it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from llm_marl.sandbox import runner as sandbox_module
from llm_marl.sandbox import (
    LoadError,
    SandboxError,
    run_program,
    run_programs,
    run_tests,
)

REPO = Path(__file__).resolve().parent.parent
ROOT = os.geteuid() == 0


def _with_marker(marker: str) -> list[int]:
    """Pids of live processes whose environment contains marker."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                environ = Path("/proc", entry, "environ").read_bytes()
            except OSError:
                continue
            if marker.encode() in environ:
                found.append(int(entry))
    return found


def _assert_nothing_left(marker: str) -> None:
    deadline = time.monotonic() + 2.0  # SIGKILLed processes take a moment to vanish
    while _with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _with_marker(marker) == []


def _run(code: str, **limits):
    """run_program with a marker in the program's environment; checks nothing is left."""
    marker = f"sandbox-test-{uuid.uuid4().hex}"
    limits["env"] = {**limits.get("env", {}), "SANDBOX_TEST_MARKER": marker}
    result = run_program(textwrap.dedent(code), **limits)
    _assert_nothing_left(marker)
    return result


def _reachable(path: str) -> bool:
    """Whether a uid owning nothing can enter every directory above path."""
    return all(os.stat(parent).st_mode & stat.S_IXOTH
               for parent in Path(os.path.realpath(path)).parents)


def _require(result, protection: str) -> None:
    if protection not in result.protections:
        pytest.skip(f"{protection} is not available here: {result.protections}")


# ------------------------------------------------------------------ ordinary programs


def test_ordinary_program_runs_with_captured_output_and_stdin():
    result = _run("""
        import sys
        print("hello", sys.stdin.read().upper())
        print("to stderr", file=sys.stderr)
    """, stdin="world")
    assert result.ok and result.returncode == 0 and result.reason == "ok"
    assert result.stdout == "hello WORLD\n"
    assert result.stderr == "to stderr\n"
    assert not result.timed_out and not result.output_truncated
    assert {"rlimits", "fresh-tmpdir", "clean-env"} <= set(result.protections)
    if ROOT:
        assert "uid-drop" in result.protections


def test_environment_is_minimal_and_parent_variables_are_invisible(monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("SANDBOX_TEST_SECRET", secret)
    result = _run("""
        import json, os
        print(json.dumps(dict(os.environ)))
    """, env={"EXTRA": "1"})
    environ = json.loads(result.stdout)
    assert set(environ) == {"PATH", "LANG", "HOME", "TMPDIR", "EXTRA", "SANDBOX_TEST_MARKER"}
    assert secret not in result.stdout
    assert environ["HOME"] == environ["TMPDIR"]


def test_exit_statuses_are_reported():
    assert _run("import sys; sys.exit(2)").returncode == 2
    exited = _run("import os; os._exit(3)")
    assert (exited.returncode, exited.reason, exited.ok) == (3, "exit code 3", False)
    raised = _run("raise ValueError('boom')")
    assert raised.returncode == 1 and raised.reason == "exit code 1: ValueError: boom"


def test_bad_arguments_are_rejected():
    with pytest.raises(TypeError):
        run_program(b"print(1)")
    with pytest.raises(ValueError):
        run_program("pass", timeout=0)
    with pytest.raises(ValueError):
        run_programs(["pass"], max_workers=-1)


# ------------------------------------------------------------------ time


def test_infinite_loop_is_killed_at_the_timeout():
    result = _run("while True: pass", timeout=1.0)
    assert result.timed_out and not result.ok
    assert result.reason == "timeout after 1.0s"
    assert result.returncode == -9


def test_loop_ignoring_sigterm_is_killed():
    result = _run("""
        import signal
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, signal.SIG_IGN)
        while True:
            pass
    """, timeout=1.0)
    assert result.timed_out and result.returncode == -9


def test_daemonized_grandchild_does_not_survive():
    result = _run("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        time.sleep(0.2)
        print("parent done")
    """, timeout=5.0, new_processes=True)
    # the run ended with the parent, not at the timeout; _run proves the grandchild is gone
    assert result.ok and result.reason == "ok" and not result.timed_out and result.stdout == "parent done\n"


# ------------------------------------------------------------------ processes and threads


def test_process_limit_binds_before_fork_and_thread_bombs():
    # First prove the limit on a harmless program (3 processes: itself and two children),
    # since a fork bomb that escapes takes down the machine.
    harmless = _run("""
        import os, time
        children = []
        for _ in range(3):
            try:
                pid = os.fork()
            except BlockingIOError as exc:
                print("refused", type(exc).__name__)
                break
            if pid == 0:
                time.sleep(1)
                os._exit(0)
            children.append(pid)
        print("forked", len(children))
        for pid in children:
            os.waitpid(pid, 0)
    """, max_processes=3, timeout=5.0, new_processes=True)
    assert harmless.ok, harmless
    assert harmless.stdout.split("\n")[:2] == ["refused BlockingIOError", "forked 2"]
    threads = _run("""
        import threading, time
        started = 0
        try:
            for _ in range(3):
                threading.Thread(target=time.sleep, args=(0.5,)).start()
                started += 1
        except RuntimeError as exc:
            print("refused", exc)
        print("started", started)
    """, max_processes=3, timeout=5.0)
    assert threads.ok and "started 2" in threads.stdout and "refused" in threads.stdout

    fork_bomb = _run("""
        import os
        while True:
            os.fork()
    """, timeout=1.5, new_processes=True)
    assert not fork_bomb.ok and fork_bomb.reason
    thread_bomb = _run("""
        import threading, time
        while True:
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    """, timeout=1.5)
    assert not thread_bomb.ok
    assert thread_bomb.reason == "exit code 1: RuntimeError: can't start new thread"


def _seccomp_expected() -> bool:
    import platform

    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    return platform.machine() in ("x86_64", "aarch64") and "Seccomp:" in status


# As root the uid drop allows a process cap of 1 at least; elsewhere the seccomp filter.
NOPROC_EXPECTED = ROOT or _seccomp_expected()
REFUSED = r"exit code 1: (PermissionError: \[Errno 1\]|BlockingIOError: \[Errno 11\])"


def _require_noproc(result) -> None:
    if NOPROC_EXPECTED:
        assert "no-new-processes" in result.protections, result.protections
    else:
        _require(result, "no-new-processes")


def _psutil_leftovers(marker: str) -> list[int]:
    """Pids of live processes whose environment holds marker, as psutil sees them."""
    psutil = pytest.importorskip("psutil")
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("SANDBOX_TEST_MARKER") == marker:
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return found


def _run_hostile(code: str, **limits):
    """_run, and psutil agrees that nothing the program tried to start is running."""
    marker = f"sandbox-test-{uuid.uuid4().hex}"
    limits["env"] = {**limits.get("env", {}), "SANDBOX_TEST_MARKER": marker}
    result = run_program(textwrap.dedent(code), **limits)
    _assert_nothing_left(marker)
    assert _psutil_leftovers(marker) == []
    return result


SPAWNS = {
    "subprocess": "import subprocess\nsubprocess.run(['sh', '-c', 'echo pwned; sleep 60 &'])",
    "popen-daemon": "import subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)",
    "fork": "import os, time\nif os.fork() == 0:\n    print('pwned'); time.sleep(60)",
    "posix_spawn": "import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'echo pwned'], {})",
    "multiprocessing": "import multiprocessing\nmultiprocessing.Process(target=print, args=('pwned',)).start()",
}


@pytest.mark.parametrize("how", sorted(SPAWNS))
def test_a_program_cannot_spawn_a_subprocess(how):
    result = _run_hostile(SPAWNS[how] + "\nprint('spawned')\n", timeout=5.0)
    _require_noproc(result)
    assert not result.ok and "pwned" not in result.stdout and "spawned" not in result.stdout
    assert re.match(REFUSED, result.reason), result.reason
    assert not result.timed_out  # refused at once: nothing to wait for


def test_os_system_starts_no_shell():
    result = _run_hostile("""
        import os
        status = os.system("echo pwned; sleep 60 &")
        raise SystemExit(f"os.system returned {status}")
    """, timeout=5.0)
    _require_noproc(result)
    assert "pwned" not in result.stdout
    assert not result.ok and result.reason == "exit code 1: os.system returned 32512"  # 127: no shell


@pytest.mark.parametrize("call", [
    "os.execv('/bin/sh', ['sh', '-c', 'echo pwned; sleep 60'])",
    "os.execvp('sh', ['sh', '-c', 'echo pwned'])",
    "os.execve(sys.executable, [sys.executable, '-c', 'print(\"pwned\")'], {})",
])
def test_a_program_cannot_exec_a_shell(call):
    result = _run_hostile(f"import os, sys\n{call}\nprint('still python')\n", timeout=5.0)
    _require_noproc(result)
    assert not result.ok and "pwned" not in result.stdout and "still python" not in result.stdout
    assert re.match(r"exit code 1: PermissionError: \[Errno 1\]", result.reason), result.reason


def test_threads_work_without_new_processes():
    result = _run("""
        import threading
        from concurrent.futures import ThreadPoolExecutor
        with open("/proc/self/status") as status:
            if "Seccomp:\\t2" not in status.read():
                raise SystemExit("no seccomp filter")
        with ThreadPoolExecutor(max_workers=4) as pool:
            print(sum(pool.map(lambda x: x * x, range(100))))
        lock = threading.Lock()
        with lock:
            print(threading.active_count())
    """, timeout=5.0)
    _require_noproc(result)
    if result.stderr.strip() == "no seccomp filter":
        pytest.skip("the fallback (a process cap of 1) refuses threads too")
    assert result.ok, result
    assert result.stdout.split() == ["328350", "1"]


def test_a_spawning_program_fails_its_tests_with_the_reason():
    report = run_tests("import subprocess\nsubprocess.run(['true'])\ndef f():\n    return 1\n",
                       ["assert f() == 1"])
    _require_noproc(report.sandbox)
    assert report.load_error.error_type in ("PermissionError", "BlockingIOError") and not report.all_passed
    assert report.results[0].error_type == "NotRun"


def test_new_processes_true_lets_a_program_fork_within_max_processes():
    result = _run("""
        import os
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """, timeout=5.0, new_processes=True)
    assert result.ok and result.stdout == "7\n"
    assert "no-new-processes" not in result.protections


@pytest.mark.skipif(not ROOT, reason="the fallback cap needs the uid drop (root)")
def test_without_seccomp_root_caps_the_dropped_uid_at_one_process(monkeypatch):
    import dataclasses

    from llm_marl.sandbox import runner

    probed = runner._isolation(True)
    monkeypatch.setattr(runner, "_isolation", lambda namespaces: dataclasses.replace(probed, seccomp=False))
    spawn = _run_hostile(SPAWNS["subprocess"] + "\nprint('spawned')\n", timeout=5.0)
    assert "no-new-processes" in spawn.protections and "spawned" not in spawn.stdout
    assert re.match(REFUSED, spawn.reason), spawn.reason
    thread = _run("import threading\nthreading.Thread(target=print).start()\n", timeout=5.0)
    assert thread.reason == "exit code 1: RuntimeError: can't start new thread"  # the trade-off


def test_killing_the_parent_and_the_trainer_fails():
    probe = _run("pass")
    if not {"uid-drop", "pid-namespace"} & set(probe.protections):
        pytest.skip("the program runs as the caller's user and could kill this test")
    result = _run(f"""
        import os, signal
        for pid in (os.getppid(), {os.getpid()}, 1):
            try:
                os.kill(pid, signal.SIGKILL)
                print("killed", pid)
            except OSError as exc:
                print("refused", pid, type(exc).__name__)
        os.kill(os.getppid(), signal.SIGKILL)
    """, timeout=5.0)
    assert not result.ok and "killed" not in result.stdout
    assert result.stdout.count("refused") == 3
    assert run_program("print('still here')").stdout == "still here\n"


# ------------------------------------------------------------------ memory and output


def test_memory_bomb_hits_the_memory_limit():
    result = _run("""
        hoard = []
        while True:
            hoard.append(bytearray(10 * 1024 * 1024))
    """, memory_mb=256, timeout=5.0)
    assert not result.ok and result.reason == "memory limit"


def test_deep_recursion_is_contained():
    result = _run("""
        import sys
        sys.setrecursionlimit(10 ** 7)
        def down(depth):
            return down(depth + 1) + 1
        down(0)
    """, memory_mb=256, timeout=2.0)
    assert not result.ok and result.reason != "ok"


def test_printing_a_gigabyte_is_cut_off():
    result = _run("""
        import sys
        chunk = "x" * 65536
        for _ in range(16384):
            sys.stdout.write(chunk)
    """, max_output_bytes=200_000, timeout=10.0)
    assert result.output_truncated and not result.timed_out and not result.ok
    assert result.reason == "output limit exceeded"
    assert len(result.stdout) + len(result.stderr) <= 200_000


def test_writing_a_gigabyte_file_hits_the_file_limit_and_the_workdir_is_removed():
    result = _run("""
        import os
        print(os.getcwd(), flush=True)
        chunk = b"x" * (1 << 20)
        with open("big", "wb") as file:
            for _ in range(1024):
                file.write(chunk)
    """, max_file_bytes=5_000_000, timeout=5.0)
    assert not result.ok and result.reason == "file size limit"
    workdir = Path(result.stdout.strip())
    assert workdir.name == "work" and not workdir.parent.exists()


# ------------------------------------------------------------------ isolation


def test_writes_outside_the_workdir_fail():
    name = f"sandbox-escape-{uuid.uuid4().hex}"
    probe = _run("pass")
    targets = [REPO / name, Path("/etc") / name]
    if "read-only-fs" in probe.protections:
        targets += [Path("/tmp") / name, Path("/var/tmp") / name, Path("/dev/shm") / name]
    if not ROOT and "read-only-fs" not in probe.protections:
        pytest.skip("without root or namespaces the program has the caller's permissions")
    try:
        result = _run(f"""
            for path in {[str(path) for path in targets]!r}:
                try:
                    open(path, "w").write("escaped")
                    print("wrote", path)
                except OSError as exc:
                    print("refused", path, type(exc).__name__)
            open("inside", "w").write("fine")
            print("inside ok")
        """)
        assert "wrote" not in result.stdout
        assert result.stdout.count("refused") == len(targets)
        assert "inside ok" in result.stdout
        assert not any(path.exists() for path in targets)
    finally:
        for path in targets:
            if path.exists():
                path.unlink()


def test_network_is_unreachable():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        result = _run(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
                print("connected")
            except OSError as exc:
                print("refused", type(exc).__name__)
        """, timeout=5.0)
        _require(result, "net-namespace")
        assert result.stdout.startswith("refused")
        with pytest.raises(BlockingIOError):
            server.accept()


def test_other_processes_are_invisible():
    probe = _run("pass")
    if not {"uid-drop", "pid-namespace"} & set(probe.protections):
        pytest.skip("the program runs as the caller's user and may read its /proc entries")
    result = _run(f"""
        import os
        try:
            print(open("/proc/{os.getpid()}/environ", "rb").read())
        except OSError as exc:
            print("refused", type(exc).__name__)
        print(sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit()))
    """)
    assert result.stdout.startswith("refused")
    _require(result, "pid-namespace")
    visible = json.loads(result.stdout.splitlines()[1])
    assert visible == [1, 2]  # the sandbox's init and the program itself


@pytest.mark.skipif(not ROOT, reason="the uid-drop fallback needs root")
def test_fallback_without_namespaces_still_bounds_and_cleans_up():
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None or not _reachable(system_python):
        pytest.skip("no interpreter reachable by an unprivileged uid")
    limits = dict(namespaces=False, python=system_python, timeout=5.0, new_processes=True)
    harmless = _run("""
        import os
        try:
            for _ in range(3):
                if os.fork() == 0:
                    os._exit(0)
        except BlockingIOError:
            print("refused")
    """, max_processes=2, **limits)
    assert "uid-drop" in harmless.protections and "pid-namespace" not in harmless.protections
    assert harmless.stdout == "refused\n"
    daemon = _run("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(60)
        print("parent done")
    """, **limits)
    assert daemon.ok and not daemon.timed_out and daemon.stdout == "parent done\n"
    loop = _run("while True: pass", **{**limits, "timeout": 1.0})
    assert loop.timed_out


@pytest.mark.skipif(not ROOT, reason="only root must refuse an unbounded process count")
def test_root_without_namespaces_refuses_an_unreachable_interpreter():
    if _reachable(sys.executable):
        pytest.skip("this interpreter is reachable by any uid")
    with pytest.raises(SandboxError, match="unprivileged uid"):
        run_program("pass", namespaces=False)


# ------------------------------------------------------------------ pool


def test_run_programs_runs_at_most_max_workers_at_once_in_order(monkeypatch):
    """Process accounting instead of clocks: every call to run_program is counted while it runs;
    a barrier of 2 parties proves that two really run together (it breaks if they do not)."""
    lock, barrier = threading.Lock(), threading.Barrier(2, timeout=30)
    running, peak, seen = [0], [0], []
    real = sandbox_module.run_program

    def counted(code, **limits):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            seen.append(code)
        try:
            barrier.wait()  # held until a second program runs at the same time
            return real(code, **limits)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(sandbox_module, "run_program", counted)
    codes = [f"print({i})" for i in range(4)]
    results = run_programs(codes, max_workers=2, timeout=10.0)
    assert [result.stdout for result in results] == ["0\n", "1\n", "2\n", "3\n"]  # input order
    assert sorted(seen) == codes and peak[0] == 2  # two ran together, never three


# ------------------------------------------------------------------ tests of a program


def test_run_tests_reports_each_test():
    program = "def inc(x):\n    return x + 1\nprint('noise')\n"
    tests = ["assert inc(1) == 2", "assert inc(1) == 3, 'off by one'", "inc(None)",
             "while True: pass", "assert inc(2) == 3"]
    report = run_tests(program, tests, timeout_per_test=0.5)
    assert report.loaded and report.load_error is None
    assert [outcome.passed for outcome in report.results] == [True, False, False, False, True]
    assert [outcome.error_type for outcome in report.results] == [
        None, "AssertionError", "TypeError", "Timeout", None]
    assert report.results[1].message == "off by one"
    assert (report.passed, report.total, report.pass_rate) == (2, 5, 0.4)
    assert not report.all_passed
    assert report.sandbox.stdout.strip() == "noise"


def test_run_tests_reports_a_syntax_error_with_its_position():
    report = run_tests("def inc(x):\n    return x +\n", ["assert inc(1) == 2"])
    assert not report.loaded
    assert report.load_error.error_type == "SyntaxError"
    assert report.load_error.lineno == 2 and report.load_error.offset is not None
    assert [outcome.error_type for outcome in report.results] == ["NotRun"]


def test_run_tests_reports_an_exception_at_definition_time():
    report = run_tests("x = 1\nraise ValueError('bad')\n", ["assert x == 1"])
    assert report.load_error == LoadError("ValueError", "bad", 2, None)
    assert report.passed == 0


def test_run_tests_is_not_fooled_by_printed_verdicts_or_a_crash():
    program = ("print('{\"test\": 0, \"failure\": null}')\n"
               "print('@@llm_marl-sandbox-00@@{\"test\": 0, \"failure\": null}')\n"
               "def f():\n    return 1\n")
    report = run_tests(program, ["assert f() == 2", "import os; os._exit(0)", "assert True"])
    assert [outcome.error_type for outcome in report.results] == [
        "AssertionError", "NotRun", "NotRun"]
