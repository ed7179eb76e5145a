"""The caller's side of one sandbox run, once its supervisor is started (see
:mod:`llm_marl.sandbox`): feed the program's stdin, collect its stdout and stderr up to a
cap and the supervisor's status lines, and stop the sandbox at the deadline or the cap.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from typing import NamedTuple

_READ_CHUNK = 65536
_STOP_GRACE = 2.0  # seconds a stopped sandbox gets to exit (and its pipes to close)


class Exchange(NamedTuple):
    """What came back from one supervisor: output, status lines, and how it was stopped."""

    stdout: bytes
    stderr: bytes
    status: bytes
    timed_out: bool
    truncated: bool
    duration: float
    supervisor_exit: int


def communicate(process: subprocess.Popen, status_fd: int, stdin: bytes | None,
                timeout: float, max_output: int) -> Exchange:
    """Feed stdin, collect capped output and status until the sandbox ends; stop it on a limit."""
    start = time.monotonic()
    out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
    captured = {out_fd: bytearray(), err_fd: bytearray(), status_fd: bytearray()}
    selector = selectors.DefaultSelector()
    for fd in captured:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    pending = memoryview(stdin or b"")
    stdin_fd = process.stdin.fileno() if process.stdin is not None else None
    if stdin_fd is not None:
        if pending:
            os.set_blocking(stdin_fd, False)
            selector.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            process.stdin.close()
    deadline = start + timeout
    timed_out = truncated = stopping = False

    def stop() -> None:
        nonlocal stopping, deadline
        stopping = True
        deadline = time.monotonic() + _STOP_GRACE
        try:
            process.send_signal(signal.SIGTERM)  # the launcher forwards it to init
        except ProcessLookupError:
            pass

    try:
        while out_fd in selector.get_map() or err_fd in selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                # Once the supervisor has exited (status closed) only strays hold the pipes.
                if stopping or status_fd not in selector.get_map():
                    break
                timed_out = True
                stop()
                continue
            for key, _ in selector.select(deadline - now):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        pending = pending[os.write(fd, pending[:_READ_CHUNK]):]
                    except (BlockingIOError, InterruptedError):
                        continue
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(fd)
                        process.stdin.close()
                    continue
                try:
                    data = os.read(fd, _READ_CHUNK)
                except (BlockingIOError, InterruptedError):
                    continue
                if not data:
                    selector.unregister(fd)
                    if fd == status_fd:
                        deadline = min(deadline, time.monotonic() + _STOP_GRACE)
                    continue
                if fd == status_fd:
                    captured[fd] += data
                    continue
                room = max_output - len(captured[out_fd]) - len(captured[err_fd])
                captured[fd] += data[:room]
                if len(data) > room and not truncated:
                    truncated = True
                    if not stopping:
                        stop()
    finally:
        selector.close()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        try:
            process.wait(timeout=_STOP_GRACE)
        except subprocess.TimeoutExpired:  # the supervisor itself is stuck: kill its group
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
    while True:  # the status pipe is closed once the supervisor is gone; read what is left
        try:
            data = os.read(status_fd, _READ_CHUNK)
        except BlockingIOError:
            break
        if not data:
            break
        captured[status_fd] += data
    return Exchange(bytes(captured[out_fd]), bytes(captured[err_fd]),
                     bytes(captured[status_fd]), timed_out, truncated,
                     time.monotonic() - start, process.returncode)
