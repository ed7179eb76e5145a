"""The sandbox's program prelude: no new processes, then the program as ``__main__``.

Not imported: the supervisor runs the program as ``python -I -S -B -c <this text> main.py``. It
installs a seccomp filter (classic BPF through ``prctl``, no library needed; ``no_new_privs`` is
already set) and then runs ``main.py`` in ``__main__``'s namespace, as ``python main.py`` would,
with its own frames cut from tracebacks.

The filter, for the interpreter's own architecture (x86_64 or aarch64):

- ``fork``, ``vfork``, ``execve``, ``execveat``: fail with EPERM (Python: ``PermissionError``),
  so ``subprocess``, ``os.system`` (exit status 127), ``os.fork``, ``os.exec*``,
  ``os.posix_spawn`` and ``multiprocessing`` start nothing;
- ``clone``: allowed only with ``CLONE_THREAD`` (a thread of this process), else EPERM;
- ``clone3``: fails with ENOSYS (its flags are in memory, out of the filter's sight), and the C
  library falls back to ``clone`` for threads, so threads keep working;
- a system call of another ABI (x32, 32-bit): EPERM.

The filter is inherited and cannot be removed. If it cannot be installed the prelude writes one
line starting with ``llm_marl-sandbox: `` to stderr and exits with status 125 before the program
runs: the caller's once-per-process probe then falls back (see :mod:`llm_marl.sandbox`), and a
program run after a successful probe fails closed.
"""


def _sandbox_prelude():
    import ctypes
    import os
    import platform
    import struct
    import sys

    table = {
        "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone3": 435}),
        "aarch64": (0xC00000B7, {"clone": 220, "execve": 221, "execveat": 281, "clone3": 435}),
    }
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno_base = 0x7FFF0000, 0x00050000
    eperm, enosys, clone_thread = 1, 38, 0x10000

    def program(machine):
        arch, numbers = table[machine]
        ops = [("load", 4), ("arch", arch), ("load", 0)]
        if machine == "x86_64":
            ops.append(("x32",))
        ops += [("deny", numbers[name]) for name in ("fork", "vfork", "execve", "execveat") if name in numbers]
        ops += [("clone", numbers["clone"]), ("clone3", numbers["clone3"]), ("return", allow)]
        labels = {"CLONE": len(ops)}
        ops += [("load", 16), ("thread",)]
        labels["ALLOW"], labels["DENY"], labels["ENOSYS"] = len(ops), len(ops) + 1, len(ops) + 2
        ops += [("return", allow), ("return", errno_base | eperm), ("return", errno_base | enosys)]
        code = []
        for i, op in enumerate(ops):
            to = lambda label: labels[label] - i - 1  # noqa: E731 - relative jump
            kind = op[0]
            if kind == "load":  # A = the 32-bit word at this offset of struct seccomp_data
                code.append((ld_abs, 0, 0, op[1]))
            elif kind == "return":
                code.append((ret, 0, 0, op[1]))
            elif kind == "arch":
                code.append((jeq, 0, to("DENY"), op[1]))
            elif kind == "x32":  # x32 ABI calls have bit 30 set
                code.append((jge, to("DENY"), 0, 0x40000000))
            elif kind == "deny":
                code.append((jeq, to("DENY"), 0, op[1]))
            elif kind == "clone":
                code.append((jeq, to("CLONE"), 0, op[1]))
            elif kind == "clone3":
                code.append((jeq, to("ENOSYS"), 0, op[1]))
            elif kind == "thread":  # low word of clone's first argument: its flags
                code.append((jset, to("ALLOW"), to("DENY"), clone_thread))
        return b"".join(struct.pack("=HBBI", *instruction) for instruction in code), len(code)

    def install():
        machine = platform.machine()
        if machine not in table:
            raise OSError("no seccomp filter for the %s architecture" % machine)
        filters, count = program(machine)
        buffer = ctypes.create_string_buffer(filters, len(filters))

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        fprog = SockFprog(count, ctypes.addressof(buffer))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong)
        for option, argument in ((38, 1), (22, 2)):  # PR_SET_NO_NEW_PRIVS; PR_SET_SECCOMP, FILTER
            if libc.prctl(option, argument, None if option == 38 else ctypes.addressof(fprog), 0, 0) != 0:
                error = ctypes.get_errno()
                raise OSError(error, "prctl(%d): %s" % (option, os.strerror(error)))

    try:
        install()
    except Exception as exc:  # noqa: BLE001 - any failure: the program must not run unfiltered
        sys.stderr.write("llm_marl-sandbox: cannot block new processes: %s\n" % (exc,))
        sys.stderr.flush()
        os._exit(125)

    import __main__

    path = sys.argv[1]
    with open(path, "rb") as file:
        source = file.read()
    namespace = __main__.__dict__
    del namespace["_sandbox_prelude"]
    namespace.update(__file__=path, __cached__=None)
    sys.argv[:] = [path]
    try:
        exec(compile(source, path, "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:  # what an uncaught exception does, without this frame
        exc.with_traceback(None if isinstance(exc, SyntaxError) else exc.__traceback__.tb_next)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        raise SystemExit(1) from None

_sandbox_prelude()
