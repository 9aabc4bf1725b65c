"""Child side of the code sandbox: confine this process, run the untrusted program, report tests.

Role: started by `tandem.sidecars.sandbox.runner` as `python -I -S -B harness.py` (or its
source with `-c` where the sandbox uid cannot read the file), inside fresh net/mount/pid namespaces
when the parent is root, or by the sandbox server (`sandbox.sandbox_server`) under its own uid.
Stdlib only: it may run under a different interpreter than the trainer's. Reads one JSON job from
stdin, then, in this order:
1. with `private_fs`: mounts small private tmpfs over every world-writable directory (/tmp,
   /var/tmp, /dev/shm, /run/lock) so that nothing the program writes outlives it;
2. makes its work dir (cwd, HOME, TMPDIR), sends the program's stdout/stderr to a file there;
3. drops to the unprivileged uid/gid (when given), then sets hard resource limits (CPU seconds,
   address space, file size, processes, open files, no core dumps) — limits are applied here,
   in the child, rather than in a `preexec_fn`, which is unsafe in a threaded parent;
4. confines itself with the job's `confine` source (`confine.py`: no_new_privs,
   non-dumpable, Landlock where the kernel has it); then, just before the program runs (in each
   I/O case's child for I/O cases, since the harness itself must still kill a case), the seccomp
   filter and, outside the namespaces mode, audit hooks refusing sockets, subprocesses and ctypes
   (and writes outside the work dir when Landlock is missing);
5. runs the tests of the job's plan (`code_tests.TestPlan.job`), streaming one result line
   per test to the parent on the original stdout: `<nonce> start|ok i|fail i|timeout i|error|done`:
   - "snippets": execs the program, then every top-level statement of each test source, one at a
     time, in the program's namespace; only the statements the plan counts report a result (setup
     such as definitions and imports runs silently, so it can never pass); with the job's `capture`
     (a plan with no tests: `program.run_program`), once the program ends (normally, by an
     exception or SystemExit) one more line, `output <hex>`, carries what it printed (`_capturer`);
   - "stdio" / "call": compiles the program, then per I/O case forks a child (without the result
     channel) that runs it with the case's input as stdin, or calls `fn_name(*input)`, and leaves
     its stdout, or its return value as JSON, in a file the harness compares with the expected
     output; a child over `case_seconds` is killed (`timeout i`), and the cases after it fail
     unrun, so a slow program costs one time limit, not one per case (a fork refused because the
     sandbox uid is at its process limit is retried until the case's deadline).
A program that fails to load (or, for I/O cases, to compile) reports `error` and no test passes.
"""

from __future__ import annotations

import ast
import ctypes
import io
import json
import os
import resource
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn, TextIO

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


def _install_guards(work: str, guard_writes: bool) -> None:
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(BLOCKED_EVENTS):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if not guard_writes:
            return
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
    capture = int(job.get("capture") or 0)  # > 0: report the program's output, at most that many characters
    out_fd = os.open(out_path, (os.O_RDWR if capture > 0 else os.O_WRONLY) | os.O_CREAT | os.O_TRUNC, 0o600)
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
    confine: dict[str, Any] = {"__name__": "confine"}
    exec(compile(job["confine"], "confine.py", "exec"), confine)  # noqa: S102 — our own module
    landlock = confine["confine_process"](os.path.realpath(work))
    guard_writes = not job["private_fs"] and not landlock  # audit hooks stand in for Landlock

    def lock_down() -> None:  # seccomp, then the audit hooks (which refuse ctypes, so last)
        confine["install_seccomp"]()
        if not job["private_fs"]:
            _install_guards(os.path.realpath(work), guard_writes)

    tests = job["tests"]
    say("start")
    if tests["kind"] == "snippets":
        finish = _capturer(job["code"], out_fd, lim["file_bytes"], capture, say) if capture > 0 else None
        lock_down()
        _run_snippets(job["code"], tests["sources"], say, finish)
    else:
        try:
            program = compile(job["code"], "<solution>", "exec")
        except BaseException:
            say("error")
            os._exit(0)
        _run_cases(program, tests, work, lim["file_bytes"], report, say, lock_down)
    say("done")
    os._exit(0)


def _run_snippets(code: str, sources: list[dict[str, Any]], say: Callable[..., None],
                  finish: Callable[[BaseException | None], bool] | None = None) -> None:
    """Exec the program, then each test statement; with `finish` (a capture run), that reports the program's
    output once the program ends and says whether it ended normally."""
    me = os.getpid()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    failure: BaseException | None = None
    try:
        exec(compile(code, "<solution>", "exec"), namespace)  # noqa: S102 — the sandboxed program
    except BaseException as e:  # the program may raise anything, SystemExit included
        if os.getpid() != me:  # a child the program forked
            os._exit(1)
        failure = e
    if finish is not None:
        if os.getpid() != me:
            os._exit(1)
        failure = None if finish(failure) else failure
    if failure is not None:
        say("error")
        os._exit(0)
    index = 0
    for source in sources:
        counted = set(source["counted"])
        for i, node in enumerate(ast.parse(source["code"], source["name"]).body):
            try:
                statement = compile(ast.Module(body=[node], type_ignores=[]), source["name"], "exec")
                exec(statement, namespace)  # noqa: S102 — a trusted test statement
                ok = True
            except BaseException:
                ok = False
            if os.getpid() != me:
                os._exit(1)
            if i in counted:
                say("ok" if ok else "fail", index)
                index += 1


def _capturer(code: str, out_fd: int, file_bytes: int, max_chars: int,
              say: Callable[..., None]) -> Callable[[BaseException | None], bool]:
    """What reports a capture run's output: `finish(failure)` reads the program's output file (stdout and
    stderr; under RLIMIT_FSIZE), adds what the interpreter would print for `failure` (the traceback; a
    SystemExit's message), keeps the first and last characters of longer output with a note of the cut
    in between (at most `max_chars` in all), and says it as `output <hex of its UTF-8>`: one line whatever
    it holds. Returns whether the program ended normally (SystemExit 0 or None included). Set up before
    the lockdown: the traceback module imported, the program's source registered for its lines, stdout
    line-buffered so that it interleaves with stderr as written."""
    import linecache
    import traceback

    linecache.cache["<solution>"] = (len(code), None, code.splitlines(keepends=True), "<solution>")
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)

    def finish(failure: BaseException | None) -> bool:
        exit_code = failure.code if isinstance(failure, SystemExit) else 1
        normal = failure is None or exit_code is None or (isinstance(exit_code, int) and exit_code == 0)
        ending = ""
        try:
            if isinstance(failure, SystemExit):
                ending = "" if normal or isinstance(exit_code, int) else f"{exit_code}\n"
            elif failure is not None:  # without the harness's own frame
                tb = failure.__traceback__.tb_next if failure.__traceback__ else None
                ending = "".join(traceback.format_exception(type(failure), failure, tb))
        except BaseException:  # out of memory, a broken exception: its name at least
            ending = f"{type(failure).__name__}\n"
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()  # type: ignore[union-attr]
            except BaseException:  # the program's replacement, or a closed or full file
                pass
        try:
            written = os.pread(out_fd, file_bytes, 0)
        except OSError:  # the program closed or replaced the descriptor
            written = b""
        text = written.decode("utf-8", "replace") + ending
        if len(text) > max_chars:
            keep = max(max_chars - 40, 0)  # room for the note
            note = f"\n[... {len(text) - keep} characters cut ...]\n"
            text = text[:keep // 2] + note + text[len(text) - (keep - keep // 2):]
        say("output", text.encode("utf-8").hex())
        return normal

    return finish


def _run_cases(program: Any, tests: dict[str, Any], work: str, cap: int, report: TextIO,
               say: Callable[..., None], lock_down: Callable[[], None]) -> None:
    in_path, out_path = os.path.join(work, "case.in"), os.path.join(work, "case.out")
    timed_out = False
    for i, case in enumerate(tests["cases"]):
        if timed_out:
            say("fail", i)
            continue
        with open(in_path, "w", encoding="utf-8") as f:
            f.write(case["input"] if tests["kind"] == "stdio" else "")
        in_fd = os.open(in_path, os.O_RDONLY)
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        deadline = time.monotonic() + tests["case_seconds"]
        pid = _fork(deadline)
        if pid == 0:
            _case_child(program, tests, case, in_fd, out_fd, report.fileno(), lock_down)
        os.close(in_fd)
        os.close(out_fd)
        if pid is None:
            say("fail", i)
            continue
        status = _wait(pid, deadline)
        _reap()
        if status is None:
            timed_out = True
            say("timeout", i)
            continue
        with open(out_path, "rb") as f:
            got = f.read(cap).decode("utf-8", "replace")
        ok = os.waitstatus_to_exitcode(status) == 0 and _same(tests["kind"], got, case["output"])
        say("ok" if ok else "fail", i)


def _case_child(program: Any, tests: dict[str, Any], case: dict[str, Any], in_fd: int, out_fd: int,
                report_fd: int, lock_down: Callable[[], None]) -> NoReturn:
    """Run one I/O case in this forked child and exit: 0 when the program ran (and returned) normally."""
    ok = False
    try:
        os.close(report_fd)  # the program gets no handle on the result channel
        lock_down()  # here, not in the harness: the harness must still kill a case at its deadline
        stdio = tests["kind"] == "stdio"
        if stdio:
            os.dup2(in_fd, 0)
            os.dup2(out_fd, 1)
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        namespace: dict[str, Any] = {"__name__": "__main__" if stdio else "solution",
                                     "__builtins__": __builtins__}
        try:
            exec(program, namespace)  # noqa: S102 — the sandboxed program
            ok = True
        except SystemExit as e:
            ok = e.code is None or e.code == 0
        if ok and not stdio:
            result = json.dumps(_function(namespace, tests["fn_name"])(*case["input"])).encode()
            view = memoryview(result)
            while view:
                view = view[os.write(out_fd, view):]
        sys.stdout.flush()
    except BaseException:
        ok = False
    finally:
        os._exit(0 if ok else 1)


def _function(namespace: dict[str, Any], name: str) -> Callable[..., Any]:
    """`name` from the program, or the method of a `Solution()` (LeetCode style)."""
    found = namespace.get(name)
    if not callable(found):
        found = getattr(namespace["Solution"](), name)
    fn: Callable[..., Any] = found
    return fn


def _same(kind: str, got: str, want: Any) -> bool:
    """Output against the expected one: stdout token by token; a return value as JSON (APPS's [value] too)."""
    if kind == "stdio":
        return got.split() == str(want).split()
    try:
        value = json.loads(got)
    except ValueError:
        return False
    return bool(value == want or (isinstance(want, list) and len(want) == 1 and value == want[0]))


def _fork(deadline: float) -> int | None:
    """os.fork(), retried while the sandbox uid is at RLIMIT_NPROC (its processes are shared with other
    samples, a fork bomb's included, until they are reaped); None if still refused at `deadline`."""
    delay = 0.002
    while True:
        try:
            return os.fork()
        except BlockingIOError:
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(2 * delay, 0.05)


def _wait(pid: int, deadline: float) -> int | None:
    """Wait status of child `pid`, or None after SIGKILLing it at `deadline` (monotonic clock)."""
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.01))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _reap() -> None:
    """Collect exited orphans of the cases (this harness is the pid namespace's init)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

if __name__ == "__main__":
    main()
