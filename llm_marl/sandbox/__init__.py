"""Isolated execution of untrusted Python: model-written code never runs in the trainer's process.

Use
---
``run_program(code)`` runs ``code`` in a fresh interpreter (``python -I -S -B``: isolated mode,
no site-packages, so only the standard library is importable) in a separate, limited process
and returns a :class:`SandboxResult` with the exit status, the captured output and a
human-readable ``reason`` ("ok", "timeout after 2.0s", "memory limit", "output limit exceeded",
"exit code 1: ValueError: ...", "killed by signal 11 (SIGSEGV)", ...). A misbehaving program is
a *result*, never an exception; :class:`SandboxError` is raised only when the sandbox itself
cannot be set up. ``run_programs(codes)`` runs many programs at once (a thread pool of waiting
threads, each sandbox its own process); ``run_tests(program, tests)`` runs a program and then
each test statement (``assert f(1) == 2``) in one sandbox and reports every test separately.

Always enforced (the sandbox needs Linux)
-----------------------------------------
- Wall-clock ``timeout``; then the program and everything it started are killed (SIGKILL, so
  ignoring SIGTERM does not help).
- Resource limits on the program's processes (``setrlimit``, inherited by its children):
  CPU seconds per process (``cpu_time``, default ``timeout`` + 1 so that a single-threaded
  program meets the wall clock first; "cpu time limit"); address space per process
  (``memory_mb``; Python raises ``MemoryError``: "memory limit"); size of any file written
  (``max_file_bytes``; Python gets ``OSError: [Errno 27] File too large``: "file size
  limit"); processes and threads at once (``max_processes``, the program included); no core
  files.
- Output: stdout and stderr are read as they arrive; once together they pass
  ``max_output_bytes`` the program is killed and the output truncated ("output limit
  exceeded"). The caller never holds more than that.
- A fresh working directory (also ``HOME`` and ``TMPDIR``), removed afterwards.
- A clean environment: ``PATH``, ``LANG``, ``HOME``, ``TMPDIR`` and the ``env`` you pass;
  nothing is inherited from the caller.
- ``no_new_privs``: set-uid binaries cannot gain privileges.
- The program is never the caller's child: it runs under a small supervisor, in a session of
  its own, so ``os.kill(os.getppid(), 9)`` reaches the supervisor at most. If the caller dies,
  the supervisor is killed too (and with namespaces, everything in the sandbox).

What depends on privileges (named in ``SandboxResult.protections``)
-------------------------------------------------------------------
- ``"uid-drop"`` (the caller is root): the program runs as a fresh random uid and gid, with no
  supplementary groups and no capabilities. This is what makes the process limit bind:
  RLIMIT_NPROC does not bind root, and it counts per uid, so each sandbox gets its own uid.
  The program cannot signal or ptrace your processes, read their ``/proc/<pid>/environ``, or
  write where only root may. Without namespaces, leftovers are killed by signalling every
  process of that uid. As root without namespaces, an interpreter that an unprivileged uid
  cannot reach (e.g. under ``/root``) is refused with :class:`SandboxError` rather than run
  with an unbounded process count; pass ``python=`` with one it can reach.
- ``"pid-namespace"``, ``"net-namespace"``, ``"read-only-fs"`` (as root, or through a user
  namespace otherwise; probed once per process by running a trivial program, and dropped with
  a logged warning when unavailable): the program sees only its own processes (``/proc`` is
  remounted); has no network at all (a loopback interface that is down: it cannot reach the
  host's ``127.0.0.1`` either); and sees every file system read-only except its working
  directory, a private tmpfs of ``max_disk_bytes`` (memory, not disk). So it cannot write to
  ``/tmp``, ``/var/tmp``, ``/dev/shm`` or the repository, nor fill the disk. Directories above
  the interpreter that an unprivileged uid could not enter (``/root`` for a pyenv Python) are
  covered by an empty read-only tmpfs with only the interpreter bound back in, which hides the
  rest of them. When the program ends or is killed the pid namespace dies with it: nothing it
  started, daemons included, survives.
- ``"user-namespace"``: the unprivileged form of the above; the program keeps your uid.
- ``"no-new-processes"`` (unless ``new_processes=True``): the program cannot start another
  process or replace itself. A seccomp filter, installed by a prelude in the program's own
  interpreter before the first line of the program runs (classic BPF through ``prctl``, via
  ``ctypes``; x86_64 and aarch64), makes ``fork``, ``vfork``, ``execve``, ``execveat`` and a
  ``clone`` without ``CLONE_THREAD`` fail with EPERM, and ``clone3`` with ENOSYS (the C
  library then creates threads with ``clone``): ``subprocess``, ``os.system`` (status 127),
  ``os.fork``, ``os.exec*``, ``os.posix_spawn`` and ``multiprocessing`` raise
  ``PermissionError`` (or fail) and start nothing, while threads keep working (still bounded
  by ``max_processes``). Its availability is probed once per process; where the filter cannot
  be installed, root falls back to a process cap of 1 for the dropped uid (RLIMIT_NPROC),
  which refuses threads too (the trade-off: ``RuntimeError: can't start new thread``), and
  otherwise programs may start processes, bounded by ``max_processes`` (a logged warning).
  A program that spawns is an ordinary failed result: ``"exit code 1: PermissionError:
  [Errno 1] Operation not permitted"``. The interpreter (``python=``) must be able to import
  ``ctypes``; if the filter ever fails to install, the program does not run (exit status 125,
  a ``llm_marl-sandbox:`` line on stderr).

What it does not protect against
--------------------------------
- Reading world-readable files, and connecting to world-writable Unix sockets on the host.
- Without namespaces: network access, writing to world-writable directories such as ``/tmp``,
  and seeing (not signalling) other processes in ``/proc``.
- Without root and without user namespaces only the rlimits apply: the program runs as your
  user and can signal your processes (even the supervisor, which then raises SandboxError),
  the process limit counts all of your processes (so it may refuse any fork), and a program
  that calls ``setsid()`` can leave processes behind.
- Kernel exploits and side channels. The seccomp filter only refuses new processes; there is
  no cgroup: ``memory_mb`` bounds each process (with ``new_processes=True`` a program may use
  up to ``max_processes * memory_mb``).
- With namespaces, POSIX shared memory and semaphores (``multiprocessing`` locks) do not work.
- :func:`run_tests` is as honest as the program: the harness and the program share one
  interpreter, so a program written to inspect the harness can forge its verdicts (it still
  cannot leave the sandbox). Ordinary prints cannot: verdicts travel on lines that start with
  a random marker.
"""

from llm_marl.sandbox.runner import *  # noqa: F403 (the names and __all__ of llm_marl.sandbox.runner)
from llm_marl.sandbox.runner import __all__  # noqa: F401
