"""How one sandboxed program is launched, limited, supervised and reported; the guarantees are
described in :mod:`llm_marl.sandbox`."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Mapping, NamedTuple, Sequence

from llm_marl.sandbox._io import Exchange, communicate

__all__ = [
    "LoadError",
    "SandboxError",
    "SandboxResult",
    "TestOutcome",
    "TestReport",
    "run_program",
    "run_programs",
    "run_tests",
]

logger = logging.getLogger(__name__)

_PATH = "/usr/local/bin:/usr/bin:/bin"
_UID_RANGE = (1 << 24, 1 << 30)  # fresh uids are drawn from here; far above real accounts
# The child-side scripts travel as text (the supervisor as `python -I -S -c`, the harness as
# the program), so nothing in the sandbox needs to reach this package's files.
_SUPERVISOR = (resources.files(__package__) / "_supervisor.py").read_text("utf-8")
_HARNESS = (resources.files(__package__) / "_harness.py").read_text("utf-8")
_NOPROC = (resources.files(__package__) / "_noproc.py").read_text("utf-8")


class SandboxError(RuntimeError):
    """The sandbox could not be set up, or its supervisor failed; a misbehaving program is
    reported in a :class:`SandboxResult` instead."""


@dataclass(frozen=True)
class SandboxResult:
    """How one sandboxed program ended.

    ``returncode`` is the exit code, or ``-N`` when the program was killed by signal N (a
    timeout or the output limit kills with SIGKILL). ``stdout``/``stderr`` are decoded as UTF-8
    (invalid bytes replaced). ``duration`` is wall-clock seconds. ``protections`` names the
    isolation that was in force (see the module documentation).
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    reason: str
    output_truncated: bool
    duration: float
    protections: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when the program exited with code 0 within its time."""
        return self.returncode == 0 and not self.timed_out


class _Limits(NamedTuple):
    """run_program's keyword arguments, validated."""

    timeout: float
    memory_mb: int
    max_output_bytes: int
    max_file_bytes: int
    max_disk_bytes: int
    max_processes: int
    cpu_time: float | None
    stdin: str | None
    env: dict[str, str]
    python: str | None
    new_processes: bool


@dataclass(frozen=True)
class _Isolation:
    """What this process can set up: namespaces (and whether through a user namespace), and
    the seccomp filter that refuses new processes."""

    namespaces: bool
    userns: bool
    seccomp: bool = False


# --------------------------------------------------------------------------------------------
# Caller side.

_isolation_lock = threading.Lock()
_isolation_cache: dict[bool, _Isolation] = {}


def _isolation(namespaces: bool) -> _Isolation:
    """What to set up, probed once per process by running a trivial program."""
    with _isolation_lock:
        if namespaces not in _isolation_cache:
            _isolation_cache[namespaces] = _probe(namespaces)
        return _isolation_cache[namespaces]


_PROBE_LIMITS = _Limits(
    timeout=30.0, memory_mb=512, max_output_bytes=65536, max_file_bytes=1 << 20,
    max_disk_bytes=1 << 20, max_processes=4, cpu_time=None, stdin=None, env={}, python=None,
    new_processes=True)


def _probe(namespaces: bool) -> _Isolation:
    isolation = _probe_namespaces(namespaces)
    return dataclasses.replace(isolation, seccomp=_probe_seccomp(isolation))


def _probe_namespaces(namespaces: bool) -> _Isolation:
    fallback = _Isolation(namespaces=False, userns=False)
    if not namespaces:
        return fallback
    candidate = _Isolation(namespaces=True, userns=os.geteuid() != 0)
    try:
        result = _launch("pass", candidate, _PROBE_LIMITS)
    except SandboxError as exc:
        logger.warning("sandbox: Linux namespaces unavailable (%s); isolation is weaker", exc)
        return fallback
    if not result.ok:
        logger.warning("sandbox: namespace probe failed (%s); isolation is weaker", result.reason)
        return fallback
    return candidate


def _probe_seccomp(isolation: _Isolation) -> bool:
    """Whether the program prelude can install its seccomp filter here (Linux on x86_64 or
    aarch64 with seccomp): a trivial program is run with it."""
    try:
        result = _launch("pass", dataclasses.replace(isolation, seccomp=True),
                         _PROBE_LIMITS._replace(new_processes=False))
    except SandboxError as exc:
        result = None
        why = str(exc)
    else:
        why = result.stderr.strip() or result.reason
    if result is None or not result.ok:
        fallback = ("a process cap of 1 for the sandbox's uid (threads are refused too)"
                    if os.geteuid() == 0 else "nothing: programs may start processes")
        logger.warning("sandbox: no seccomp filter against new processes (%s); fallback: %s",
                       why, fallback)
        return False
    return True


def _enterable(path: str) -> bool:
    """Whether a uid owning nothing can reach path (every directory above it is o+x)."""
    parts = os.path.realpath(path).strip("/").split("/")[:-1]
    return all(os.stat("/" + "/".join(parts[:depth])).st_mode & stat.S_IXOTH
               for depth in range(len(parts) + 1))


def _interpreter(python: str | None) -> tuple[str, list[str]]:
    """The interpreter to exec and the directories it needs (its prefixes)."""
    if python is None:
        executable = os.path.realpath(sys.executable)
        needed = {sys.base_prefix, sys.base_exec_prefix, os.path.dirname(executable)}
    else:
        executable = os.path.realpath(python)
        needed = {os.path.dirname(os.path.dirname(executable))}
    return executable, sorted(os.path.realpath(path) for path in needed)


def _launch(code: str, isolation: _Isolation, limits: _Limits) -> SandboxResult:
    """Run code once with the given isolation and limits."""
    root = os.geteuid() == 0
    python, prefixes = _interpreter(limits.python)
    if root and not isolation.namespaces and not all(map(_enterable, prefixes)):
        raise SandboxError(
            f"running as root without namespaces, the interpreter {python} must be reachable "
            "by an unprivileged uid (to bound the number of processes); pass python= with a "
            "world-readable interpreter")
    uid = secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0] if root else None
    owner = (os.getuid(), os.getgid()) if uid is None else (uid, uid)
    protections = ["rlimits", "fresh-tmpdir", "clean-env", "no-new-privs"]
    if root:
        protections.append("uid-drop")
    # No new processes: the seccomp prelude, else (as root) a process cap of 1 for the
    # dropped uid, which refuses threads too; else nothing.
    prelude = None if limits.new_processes or not isolation.seccomp else _NOPROC
    capped = not limits.new_processes and not isolation.seccomp and root
    if prelude is not None or capped:
        protections.append("no-new-processes")
    if isolation.namespaces:
        protections += ["pid-namespace", "net-namespace", "read-only-fs"]
        if isolation.userns:
            protections.append("user-namespace")

    base = tempfile.mkdtemp(prefix="llm_marl_sandbox_")
    try:
        # base/main.py (the program, read-only) and base/work (its working directory).
        os.chmod(base, 0o711)
        workdir = os.path.join(base, "work")
        os.mkdir(workdir, 0o700)
        os.chown(workdir, *owner)
        program = os.path.join(base, "main.py")
        with open(program, "w", encoding="utf-8", errors="surrogatepass") as file:
            file.write(code)
        os.chown(program, *owner)
        os.chmod(program, 0o400)
        cpu = math.ceil(limits.timeout + 1 if limits.cpu_time is None else limits.cpu_time)
        memory = limits.memory_mb * 1024 * 1024
        # In a user namespace the launcher and init count against the same process limit.
        processes = (1 if capped else limits.max_processes) + (2 if isolation.userns else 0)
        config = {
            "caller": os.getpid(),
            "namespaces": isolation.namespaces,
            "userns": isolation.userns,
            "uid": uid,
            "python": python,
            "program": program,
            "prelude": prelude,
            "workdir": workdir,
            "workdir_options": f"size={limits.max_disk_bytes},nr_inodes=16384,mode=0700,"
                               f"uid={owner[0]},gid={owner[1]}",
            "expose": [path for path in prefixes if root and not _enterable(path)],
            "rlimits": {
                "RLIMIT_CPU": (cpu, cpu + 1),
                "RLIMIT_AS": (memory, memory),
                "RLIMIT_FSIZE": (limits.max_file_bytes, limits.max_file_bytes),
                "RLIMIT_NPROC": (processes, processes),
                "RLIMIT_CORE": (0, 0),
            },
            "env": {"PATH": _PATH, "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir,
                    **limits.env},
        }
        exchange = _supervise(config, base, limits)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    records = [json.loads(line) for line in exchange.status.decode().splitlines() if line]
    errors = [record["error"] for record in records if "error" in record]
    if errors:
        raise SandboxError("; ".join(errors))
    stderr = exchange.stderr.decode("utf-8", errors="replace")
    if not records and not (exchange.timed_out or exchange.truncated):
        raise SandboxError(f"the sandbox supervisor ended without a status (exit "
                           f"{exchange.supervisor_exit}): {stderr[-2000:]}")
    returncode = -signal.SIGKILL  # stopped before it could report
    for record in records:
        returncode = record["exit"] if "exit" in record else -record["signal"]
    return SandboxResult(
        returncode=returncode,
        stdout=exchange.stdout.decode("utf-8", errors="replace"),
        stderr=stderr,
        timed_out=exchange.timed_out,
        reason=_reason(returncode, stderr, exchange.timed_out, exchange.truncated,
                       limits.timeout),
        output_truncated=exchange.truncated,
        duration=exchange.duration,
        protections=tuple(protections),
    )


def _supervise(config: dict, cwd: str, limits: _Limits) -> Exchange:
    """Start the supervisor with config (plus the status pipe) and talk to it until it ends."""
    config_read, config_write = os.pipe()
    status_read, status_write = os.pipe()
    try:
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _SUPERVISOR, str(config_read)],
                stdin=subprocess.DEVNULL if limits.stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(config_read, status_write), env={"PATH": _PATH, "LANG": "C.UTF-8"},
                cwd=cwd, start_new_session=True)
        finally:
            os.close(config_read)
            os.close(status_write)
        try:
            with os.fdopen(config_write, "wb") as config_file:
                config_write = None
                config_file.write(json.dumps({**config, "status_fd": status_write}).encode())
        except BrokenPipeError:  # the supervisor died at once; its stderr says why
            pass
        stdin = None if limits.stdin is None else limits.stdin.encode("utf-8", "surrogatepass")
        return communicate(process, status_read, stdin, limits.timeout,
                           limits.max_output_bytes)
    finally:
        os.close(status_read)
        if config_write is not None:
            os.close(config_write)


def _reason(returncode: int, stderr: str, timed_out: bool, truncated: bool,
            timeout: float) -> str:
    if timed_out:
        return f"timeout after {float(timeout)}s"
    if truncated:
        return "output limit exceeded"
    if returncode == 0:
        return "ok"
    if returncode < 0:
        number = -returncode
        if number == signal.SIGXCPU:
            return "cpu time limit"
        if number == signal.SIGXFSZ:
            return "file size limit"
        try:
            name = signal.Signals(number).name
        except ValueError:
            return f"killed by signal {number}"
        return f"killed by signal {number} ({name})"
    lines = stderr.strip().splitlines()
    last = lines[-1].strip() if lines else ""
    if last.startswith("MemoryError"):
        return "memory limit"
    if "[Errno 27]" in last:
        return "file size limit"
    return f"exit code {returncode}: {last}" if last else f"exit code {returncode}"


def run_program(
    code: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 512,
    max_output_bytes: int = 1_000_000,
    max_file_bytes: int = 10_000_000,
    max_disk_bytes: int = 50_000_000,
    max_processes: int = 8,
    cpu_time: float | None = None,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    namespaces: bool = True,
    new_processes: bool = False,
) -> SandboxResult:
    """Run untrusted Python ``code`` in a fresh, limited interpreter process; never raises for
    anything the program does.

    ``timeout``: wall-clock seconds. ``memory_mb``: address space per process.
    ``max_output_bytes``: stdout and stderr together. ``max_file_bytes``: largest file the
    program may write. ``max_disk_bytes``: total size of its working directory (enforced
    with namespaces). ``max_processes``: processes and threads at once, the program included.
    ``cpu_time``: CPU seconds per process (default ``timeout`` + 1). ``stdin``: text fed to the
    program. ``env``: extra environment variables. ``python``: interpreter to run (default:
    this one; it must be able to import ``ctypes`` to refuse new processes). ``namespaces``:
    use Linux namespaces where available (False: rlimits and the uid drop only).
    ``new_processes``: let the program start processes (fork, exec, subprocess), bounded by
    ``max_processes``; by default it cannot. Raises :class:`SandboxError` when the sandbox
    cannot be set up.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if not sys.platform.startswith("linux"):
        raise SandboxError("the sandbox needs Linux")
    for name, value in (("timeout", timeout), ("memory_mb", memory_mb),
                        ("max_output_bytes", max_output_bytes),
                        ("max_file_bytes", max_file_bytes), ("max_disk_bytes", max_disk_bytes),
                        ("max_processes", max_processes)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    if cpu_time is not None and not cpu_time > 0:
        raise ValueError(f"cpu_time must be positive, got {cpu_time!r}")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str)
                                   for k, v in env.items()):
        raise TypeError("env must map str to str")
    limits = _Limits(timeout=timeout, memory_mb=memory_mb, max_output_bytes=max_output_bytes,
                     max_file_bytes=max_file_bytes, max_disk_bytes=max_disk_bytes,
                     max_processes=max_processes, cpu_time=cpu_time, stdin=stdin,
                     env=dict(env or {}), python=python, new_processes=bool(new_processes))
    return _launch(code, _isolation(namespaces), limits)


def run_programs(codes: Sequence[str], *, max_workers: int | None = None,
                 **limits) -> list[SandboxResult]:
    """Run every program in its own sandbox, at most ``max_workers`` (default: the number of
    CPUs) at once; results are in input order. ``limits`` are :func:`run_program`'s keywords."""
    codes = list(codes)
    workers = max_workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"max_workers must be positive, got {max_workers!r}")
    if not codes:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(codes)),
                            thread_name_prefix="sandbox") as pool:
        return list(pool.map(functools.partial(run_program, **limits), codes))


# --------------------------------------------------------------------------------------------
# Tests of a program, in one sandbox.


@dataclass(frozen=True)
class LoadError:
    """Why a program failed to load: a syntax error or an exception at definition time.

    ``lineno``/``offset`` are 1-based positions in the program, when known.
    """

    __test__ = False
    error_type: str
    message: str
    lineno: int | None = None
    offset: int | None = None


@dataclass(frozen=True)
class TestOutcome:
    """One test statement and how it went (``error_type`` is None when it passed).

    ``error_type`` is the exception's class name, ``"Timeout"`` past the per-test budget, or
    ``"NotRun"`` when the sandbox ended (or the program failed to load) before the test.
    """

    __test__ = False
    test: str
    passed: bool
    error_type: str | None = None
    message: str = ""


@dataclass(frozen=True)
class TestReport:
    """Per-test results of :func:`run_tests`, the load error if any, and the raw sandbox run."""

    __test__ = False
    results: tuple[TestOutcome, ...]
    load_error: LoadError | None
    sandbox: SandboxResult

    @property
    def loaded(self) -> bool:
        """Whether the program itself ran to completion before the tests."""
        return self.load_error is None

    @property
    def passed(self) -> int:
        """Number of tests that passed."""
        return sum(outcome.passed for outcome in self.results)

    @property
    def total(self) -> int:
        """Number of tests."""
        return len(self.results)

    @property
    def all_passed(self) -> bool:
        """True when the program loaded and every test passed (vacuously with no tests)."""
        return self.loaded and self.passed == self.total

    @property
    def pass_rate(self) -> float:
        """Fraction of tests passed (0.0 with no tests)."""
        return self.passed / self.total if self.total else 0.0


def run_tests(program: str, tests: Sequence[str], *, timeout_per_test: float = 2.0,
              **limits) -> TestReport:
    """Run ``program``, then each test statement in turn, in one sandbox.

    Loading the program and each test get ``timeout_per_test`` seconds (SIGALRM inside the
    sandbox); the whole run gets ``limits.timeout``, by default enough for all of them plus
    two seconds. Tests share the program's globals. ``limits`` are :func:`run_program`'s
    keywords.
    """
    tests = list(tests)
    if not timeout_per_test > 0:
        raise ValueError(f"timeout_per_test must be positive, got {timeout_per_test!r}")
    limits.setdefault("timeout", timeout_per_test * (len(tests) + 1) + 2.0)
    mark = f"@@llm_marl-sandbox-{secrets.token_hex(16)}@@"
    call = f"main({mark!r}, {program!r}, {tests!r}, {float(timeout_per_test)!r})"
    result = run_program(f"{_HARNESS}\n\n{call}\n", **limits)

    verdict = re.compile("\n" + re.escape(mark) + "([^\n]*)\n")
    records = [json.loads(line) for line in verdict.findall(result.stdout)]
    load = next((record for record in records if "load" in record), None)
    failures = {record["test"]: record["failure"] for record in records if "test" in record}
    if load is None:
        load_error = LoadError("NotRun", f"the sandbox ended first: {result.reason}")
    elif load["load"] is not None:
        load_error = LoadError(**load["load"])
    else:
        load_error = None
    outcomes = []
    for index, test in enumerate(tests):
        if index not in failures:
            why = "the program failed to load" if load_error else f"the sandbox ended first: " \
                                                                 f"{result.reason}"
            outcomes.append(TestOutcome(test, False, "NotRun", why))
        elif failures[index] is None:
            outcomes.append(TestOutcome(test, True))
        else:
            failure = failures[index]
            outcomes.append(TestOutcome(test, False, failure["error_type"], failure["message"]))
    return TestReport(results=tuple(outcomes), load_error=load_error,
                      sandbox=dataclasses.replace(result, stdout=verdict.sub("", result.stdout)))
