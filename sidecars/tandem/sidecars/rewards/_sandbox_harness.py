"""Child side of the code sandbox: confine this process, run the untrusted program, report tests.

Role: started by `tandem.sidecars.rewards.sandbox` as `python -I -S -B _sandbox_harness.py`
(inside fresh net/mount/pid namespaces when the parent is root). Stdlib only: it may run under a
different interpreter than the trainer's. Reads one JSON job from stdin, then, in this order:
1. with `private_fs`: mounts small private tmpfs over every world-writable directory (/tmp,
   /var/tmp, /dev/shm, /run/lock) so that nothing the program writes outlives it;
2. makes its work dir (cwd, HOME, TMPDIR), sends the program's stdout/stderr to a file there;
3. drops to the unprivileged uid/gid (when given), then sets hard resource limits (CPU seconds,
   address space, file size, processes, open files, no core dumps) — limits are applied here,
   in the child, rather than in a `preexec_fn`, which is unsafe in a threaded parent;
4. in `basic` isolation (no namespaces) installs audit hooks refusing sockets, subprocesses,
   ctypes and writes outside the work dir;
5. execs the program, then each test snippet in the program's namespace, streaming one result line
   per test to the parent on the original stdout: `<nonce> start|ok i|fail i|error|done`.
A program that fails to load reports `error` and no test passes.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any

MS_NOSUID, MS_NODEV = 2, 4
WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
BLOCKED_EVENTS = ("socket.", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                  "ctypes.", "pty.spawn")
WRITE_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
                "os.chown", "os.truncate", "os.utime", "shutil.rmtree")


def _mount_private_tmpfs(size: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for target in WRITABLE_DIRS:
        if os.path.isdir(target):
            rc = libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                            f"size={size},mode=1777".encode())
            if rc != 0:
                raise OSError(ctypes.get_errno(), f"mount tmpfs on {target}")


def _inside(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def _install_guards(work: str) -> None:
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(BLOCKED_EVENTS):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and args and isinstance(args[0], str | bytes):
            mode, flags = args[1], args[2] if len(args) > 2 else 0
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(flags & write_flags)
            if writes and not _inside(os.fsdecode(args[0]), work):
                raise PermissionError(f"sandbox: writing {args[0]!r} outside the work dir")
        elif event.startswith(WRITE_EVENTS):
            for a in args:
                if isinstance(a, str | bytes) and not _inside(os.fsdecode(a), work):
                    raise PermissionError(f"sandbox: {event} outside the work dir")

    sys.addaudithook(hook)


def _limit(kind: int, value: int) -> None:
    resource.setrlimit(kind, (value, value))


def main() -> None:
    job = json.loads(sys.stdin.read())
    nonce: str = job["nonce"]
    report = os.fdopen(os.dup(1), "w", buffering=1)

    def say(*words: object) -> None:
        report.write(" ".join([nonce, *map(str, words)]) + "\n")

    lim = job["limits"]
    if job["private_fs"]:
        _mount_private_tmpfs(lim["tmpfs_bytes"])
        work = "/tmp/work"
        os.makedirs(work, exist_ok=True)
    else:
        work = job["workdir"]
    uid, gid = job.get("uid"), job.get("gid")
    out_path = os.path.join(work, "output.txt")
    out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    if uid is not None:
        os.chown(work, uid, gid)
        os.chown(out_path, uid, gid)
    os.chmod(work, 0o700)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.chdir(work)
    os.environ.clear()
    os.environ.update({"HOME": work, "TMPDIR": work, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    if uid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    _limit(resource.RLIMIT_CPU, lim["cpu_seconds"])
    _limit(resource.RLIMIT_AS, lim["memory_bytes"])
    _limit(resource.RLIMIT_FSIZE, lim["file_bytes"])
    _limit(resource.RLIMIT_NPROC, lim["processes"])
    _limit(resource.RLIMIT_NOFILE, lim["open_files"])
    _limit(resource.RLIMIT_CORE, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes fail with EFBIG instead
    if not job["private_fs"]:
        _install_guards(os.path.realpath(work))
    me = os.getpid()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    say("start")
    try:
        exec(compile(job["code"], "<solution>", "exec"), namespace)  # noqa: S102 — the sandboxed program
    except BaseException:  # the program may raise anything, SystemExit included
        if os.getpid() == me:
            say("error")
            os._exit(0)
        os._exit(1)
    for i, test in enumerate(job["tests"]):
        try:
            exec(compile(test, f"<test {i}>", "exec"), namespace)  # noqa: S102 — a trusted test snippet
            ok = True
        except BaseException:
            ok = False
        if os.getpid() != me:
            os._exit(1)
        say("ok" if ok else "fail", i)
    say("done")
    os._exit(0)


if __name__ == "__main__":
    main()
