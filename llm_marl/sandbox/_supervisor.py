"""The sandbox supervisor: the child-side script that :mod:`llm_marl.sandbox` starts.

It is not imported: the caller runs its text as ``python -I -S -c <text> <fd>`` with the
caller's privileges. It reads its configuration (JSON) from the pipe ``fd`` and forks twice:

- launcher L: enters the namespaces, waits for I;
- init I (pid 1 of the new pid namespace): sets up the file system, reaps, reports the
  program's exit status, kills what the program left;
- program: limits itself, drops its uid and execs the interpreter on the program file (through
  the prelude ``_noproc.py``, which first refuses new processes, when ``CONFIG["prelude"]``).

SIGTERM to L asks for a stop: L forwards it to I, which SIGKILLs the program's process group
and reports. L outlives I, so once L has exited the pid namespace is empty. Status lines (JSON)
go to the caller on the file descriptor ``CONFIG["status_fd"]``:
``{"exit": n}`` | ``{"signal": n}`` | ``{"error": text}``.
"""

import ctypes, json, os, resource, signal, sys

CONFIG = {}  # set by main() from the configuration pipe
STATUS = -1  # CONFIG["status_fd"]
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)
LIBC.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
LIBC.unshare.argtypes = (ctypes.c_int,)
LIBC.prctl.argtypes = (ctypes.c_int,) + (ctypes.c_ulong,) * 4
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MNT_DETACH, PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 2, 1, 38
NOT_MADE_READ_ONLY = ("/proc", "/sys", "/dev/pts")  # with their submounts; and /dev itself
TERM = {signal.SIGTERM}


def report(**record):
    os.write(STATUS, (json.dumps(record) + "\n").encode())


def call(name, *args):
    if getattr(LIBC, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s%r: %s" % (name, args, os.strerror(err)))


def encoded(text):
    return None if text is None else text.encode()


def mount(source, target, fstype, flags, data=None):
    call("mount", encoded(source), encoded(target), encoded(fstype), flags, encoded(data))


def write_file(path, text):
    with open(path, "w") as file:
        file.write(text)


def enter_namespaces():
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET
    if not CONFIG["userns"]:
        call("unshare", flags)
        return
    uid, gid = os.getuid(), os.getgid()
    call("unshare", flags | CLONE_NEWUSER)
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", "%d %d 1" % (uid, uid))
    write_file("/proc/self/gid_map", "%d %d 1" % (gid, gid))


def mount_points():
    with open("/proc/self/mountinfo") as file:
        for line in file:
            fields = line.split()
            path = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
            yield path, set(fields[5].split(","))


def remount_read_only(path, options):
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for name, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC)):
        if name in options:
            flags |= bit
    mount(None, path, None, flags)


def closed_ancestor(path):
    """The first directory above path that an unprivileged uid cannot enter, or None."""
    parts = path.strip("/").split("/")[:-1]
    for depth in range(len(parts) + 1):
        ancestor = "/" + "/".join(parts[:depth])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def expose(path, stash):
    """Cover path's closed ancestor with an empty tmpfs and bind path back in, read-only."""
    closed = closed_ancestor(path)
    if closed is None:
        return
    mount(path, stash, None, MS_BIND | MS_REC)
    mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    os.makedirs(path, exist_ok=True)
    mount(stash, path, None, MS_BIND | MS_REC)
    call("umount2", stash.encode(), MNT_DETACH)
    remount_read_only(path, {"nosuid", "nodev"})
    remount_read_only(closed, {"nosuid", "nodev"})


def isolate_filesystem():
    work = CONFIG["workdir"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, CONFIG["workdir_options"])
    stash = os.path.join(os.path.dirname(work), "stash")
    if CONFIG["expose"]:
        os.mkdir(stash, 0o700)
    for path, options in list(mount_points()):
        skipped = path == work or path == "/dev" or any(
            path == top or path.startswith(top + "/") for top in NOT_MADE_READ_ONLY)
        if not skipped and "ro" not in options:
            remount_read_only(path, options)
    for path in CONFIG["expose"]:
        expose(path, stash)


def become_program():
    os.setsid()
    os.set_inheritable(STATUS, False)
    for name, (soft, hard) in CONFIG["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    uid = CONFIG["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.chdir(CONFIG["workdir"])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, TERM)
    python = CONFIG["python"]
    prelude = ["-c", CONFIG["prelude"]] if CONFIG.get("prelude") else []  # no new processes
    os.execve(python, [python, "-I", "-S", "-B"] + prelude + [CONFIG["program"]], CONFIG["env"])


def kill_group(pgid):
    for kill, target in ((os.killpg, pgid), (os.kill, pgid)):
        try:
            kill(target, signal.SIGKILL)
        except OSError:
            pass


def kill_uid(uid):
    """SIGKILL every process of uid: a helper with that uid signals all it may (kill(-1))."""
    helper = os.fork()
    if helper == 0:
        try:
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(helper, 0)


def init():
    program = None

    def stop(signum, frame):  # SIGTERM stays blocked (since the launcher) until program is set
        kill_group(program)

    signal.signal(signal.SIGTERM, stop)
    try:
        call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if CONFIG["namespaces"]:
            isolate_filesystem()
        program = os.fork()
    except BaseException as exc:
        report(error="setting up the sandbox: %s" % (exc,))
        os._exit(1)
    if program == 0:
        try:
            become_program()
        except BaseException as exc:
            report(error="starting the program: %s" % (exc,))
        os._exit(127)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, TERM)
    while True:  # as pid 1 of a namespace, also reap orphans
        pid, status = os.waitpid(-1, 0)
        if pid == program:
            break
    kill_group(program)
    if CONFIG["uid"] is not None and not CONFIG["namespaces"]:
        kill_uid(CONFIG["uid"])
    if os.WIFSIGNALED(status):
        report(signal=os.WTERMSIG(status))
    else:
        report(exit=os.WEXITSTATUS(status))
    os._exit(0)


def launcher():
    child = None

    def forward(signum, frame):
        if child is None:
            os._exit(1)
        os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != CONFIG["caller"]:
        return
    try:
        if CONFIG["namespaces"]:
            enter_namespaces()
    except OSError as exc:
        report(error="entering namespaces: %s" % (exc,))
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, TERM)
    pid = os.fork()
    if pid == 0:
        init()
    child = pid
    signal.pthread_sigmask(signal.SIG_UNBLOCK, TERM)
    os.waitpid(child, 0)


def main():
    global CONFIG, STATUS
    with os.fdopen(int(sys.argv[1]), "rb") as config_file:
        CONFIG = json.loads(config_file.read())
    STATUS = CONFIG["status_fd"]
    launcher()


if __name__ == "__main__":
    main()
