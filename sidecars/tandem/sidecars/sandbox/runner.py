"""Code executor: runs generated Python against a dataset's tests in a sandbox; returns the pass fraction.

Role: the runner behind the `codeExec` rule-based reward. Callers: `rewards.code_exec` (from
`rewards.combine`'s thread pool, concurrently with model inference — hence no `preexec_fn`, which is
unsafe in a threaded parent), and `sandbox.sandbox_server`, which runs the programs its clients send here in
"basic" mode. The program is the completion's last fenced Python block (`rewards.code_exec.extract_code`);
the tests are the dataset answer field in any format `sandbox.code_tests` reads (assert lists, HumanEval
`check` + `entry_point`, stdin/stdout or call-based I/O cases), where only asserts, check calls and I/O cases count.

Isolation, chosen once per process by `isolation_mode()`:
- "server" (the pod env names a sandbox server: `TANDEM_SANDBOX_SOCKET`; what every pod of a job
  with a codeExec reward uses, and `tandem run`): `run_remote` sends the program, its tests and the
  limits over a Unix socket to `sandbox.sandbox_server`, which runs them as below ("basic") under its
  own uid, in its own container. The trainer image runs as uid 10001 under Pod Security
  "restricted": no capability to setuid, and the runtime's default seccomp profile refuses the
  user/net namespaces the next mode needs, so a program run by the trainer itself would share its
  uid, files, /proc (the job's token in its environ), GPUs and container. The server shares none of
  it. Cost: a connect and two JSON messages per program (docs/security.md, `bench/sandbox_overhead.py`).
- "namespaces" (root, `unshare` works, no server — direct callers such as tests and benchmarks on
  these machines): `unshare --net --mount --pid --fork --kill-child --mount-proc` starts the harness
  in a fresh network namespace (loopback down: no connection anywhere, 127.0.0.1 included), a
  private mount namespace where the harness mounts small tmpfs over every world-writable directory,
  and a pid namespace (every process the program starts dies with it). The harness then drops to
  `nobody` (so the rest of the filesystem is read-only to it and RLIMIT_NPROC applies).
- "basic" (neither): the harness runs as this process's user (as `nobody` when root).
In every mode the harness sets hard limits (CPU seconds, address space, file size, processes, open
files, no core) and confines the program with `confine.py`: no_new_privs, non-dumpable, a
seccomp filter (no socket, exec, ptrace, setsid/setpgid, namespace or mount calls, io_uring, bpf;
signals only to its own process group) and, where the kernel has Landlock, reads limited to the
system and interpreter trees and writes to its work dir. Outside the namespaces mode, audit hooks
also refuse sockets, subprocesses and ctypes, and writes outside the work dir where Landlock is
missing (a C extension could bypass those hooks; the seccomp filter holds regardless). In "basic"
mode as a non-root user, the program shares that user's files and processes wherever Landlock is
missing: a pod uses "server".
In all modes: a fresh interpreter with `-I -S -B` (no site, no env, no bytecode written), its own
work dir as cwd/HOME/TMPDIR, its output to a size-capped file, a wall-clock deadline after which
the whole process group is SIGKILLed, and a cap on what the parent reads back.

The score is passed tests / tests (results stream per test, so a timeout keeps the tests that
passed before it); a program that fails to load scores 0; with no tests, 1.0 when the program runs
to completion. The time limit covers the program and all its test statements; with I/O cases it
applies to each case (the harness kills a case at the limit and fails the cases after it). Tests
in no format `code_tests.py` reads raise its `TestFormatError`, naming what is wrong, rather than
scoring every program alike. The result protocol resists naive forgery (a per-run nonce; I/O
cases run without the result channel; each test counts once) but a program that introspects the
harness could forge lines: the sandbox protects the host, not the score's honesty against
adversarial code. With `capture` and no tests (`program.run_program`, the rollout's `python`
tool), the result also carries what the program printed (stdout and stderr, capped).
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import re
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from tandem.sidecars.sandbox.code_tests import TestPlan, parse_tests
from tandem.sidecars.sandbox.types import ExecResult as ExecResult
from tandem.sidecars.sandbox.types import Isolation as Isolation
from tandem.sidecars.sandbox.types import SandboxError as SandboxError
from tandem.sidecars.sandbox.types import SandboxLimits as SandboxLimits
from tandem.spec.podenv import PodEnv

HARNESS = Path(__file__).with_name("harness.py")
CONFINE = Path(__file__).with_name("confine.py")
SOCKET_ENV = PodEnv.var("sandbox_socket")
CONNECT_WAIT = 60.0  # seconds a client waits for the server's socket (it may be starting or restarting)
REPLY_MARGIN = 10.0  # seconds past a run's own deadline that a client waits for the server's reply
UNSHARE = ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
           "--propagation", "private", "--"]
STARTUP_ALLOWANCE = 5.0  # seconds the interpreter may take to reach the program, on top of the timeout
CASE_ALLOWANCE = 0.5  # seconds per I/O case for the harness's fork, files and comparison
EXIT_GRACE = 1.0  # seconds a sandbox that reported its results gets to exit before it is killed
# Harnesses started and not yet reaped, and the lock held while one is started and registered: a
# process that reaps orphans (the sandbox server, PID 1 of its container) must leave these to Popen.
SPAWN_LOCK = threading.Lock()
HARNESSES: set[int] = set()


def _world_readable_stdlib() -> bool:
    path = Path(sysconfig.get_paths()["stdlib"]).resolve()
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & 0o001 or (p == path and not mode & 0o004):
            return False
    return True


@functools.lru_cache(maxsize=1)
def _nobody() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


@functools.lru_cache(maxsize=4)
def sandbox_python(ids: tuple[int, int] | None = None) -> str:
    """An interpreter whose stdlib uid/gid `ids` (default: `nobody` when root) can read (the trainer's
    may live under /root)."""
    ids = ids or _nobody()
    if ids is None or _world_readable_stdlib():
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate):
            probe = subprocess.run([candidate, "-I", "-S", "-B", "-c", "import json, fractions, re"],
                                   user=ids[0], group=ids[1], extra_groups=[], capture_output=True,
                                   timeout=30, check=False)
            if probe.returncode == 0:
                return candidate
    raise SandboxError("no Python interpreter readable by the sandbox user")


@functools.lru_cache(maxsize=4)
def harness_command(ids: tuple[int, int] | None = None) -> tuple[str, ...]:
    """The harness's command line for a sandbox running as uid/gid `ids` (default: `nobody` when root):
    its path, or its source with `-c` where that user cannot read the file (a checkout under /root)."""
    ids = ids or _nobody()
    readable = os.access(HARNESS, os.R_OK) if ids is None else _world_readable(HARNESS)
    script = [str(HARNESS)] if readable else ["-c", HARNESS.read_text()]
    return (sandbox_python(ids), "-I", "-S", "-B", *script)


def _world_readable(path: Path) -> bool:
    p = path.resolve()
    return bool(p.stat().st_mode & 0o004) and all(q.stat().st_mode & 0o001 for q in p.parents)


@functools.lru_cache(maxsize=1)
def confine_source() -> str:
    """`confine.py`, which the harness runs from its job (it imports nothing outside the stdlib)."""
    return CONFINE.read_text()


def sandbox_socket() -> str | None:
    """The sandbox server's socket from the pod env contract (`TANDEM_SANDBOX_SOCKET`), if any."""
    return os.environ.get(SOCKET_ENV) or None


@functools.lru_cache(maxsize=1)
def isolation_mode() -> Isolation:
    """"server" when the pod env names a sandbox server; else "namespaces" when root and `unshare`
    works here; else "basic"."""
    if sandbox_socket() is not None:
        return "server"
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "basic"
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30, check=False)
    return "namespaces" if probe.returncode == 0 else "basic"


_HEX = re.compile(r"(?:[0-9a-f]{2})+")


def run_tests(
    code: str, tests: object, limits: SandboxLimits | None = None, isolation: Isolation | None = None,
    *, command: Sequence[str] | None = None, capture: int = 0,
) -> ExecResult:
    """Run `code` against `tests` (an answer field or a `TestPlan`) in the sandbox; see the module docstring.

    `command` replaces `harness_command()` (the server resolves it before it drops its privileges).
    `capture` > 0 (a plan with no tests; `program.run_program`): the result's `output` holds what the
    program printed, at most that many characters.
    Raises `code_tests.TestFormatError` (a ValueError) when the tests are in no format it reads."""
    lim = limits or SandboxLimits()
    mode = isolation or isolation_mode()
    if mode == "namespaces" and isolation_mode() != "namespaces":
        raise SandboxError("namespaces isolation is not available here (needs root and unshare)")
    plan = tests if isinstance(tests, TestPlan) else parse_tests(tests)
    run_seconds = lim.timeout_seconds if not plan.cases else \
        len(plan.cases) * (lim.timeout_seconds + CASE_ALLOWANCE)
    if mode == "server":
        path = sandbox_socket()
        if path is None:
            raise SandboxError(f"server isolation needs the sandbox server's socket in {SOCKET_ENV}")
        return run_remote(path, code, plan, lim, run_seconds, capture)
    nonce = secrets.token_hex(16)
    ids = _nobody()
    workdir = None if mode == "namespaces" else tempfile.mkdtemp(prefix="tandem-sbx-")
    job = {
        "nonce": nonce, "code": code, "tests": plan.job(lim.timeout_seconds), "private_fs": mode == "namespaces",
        "confine": confine_source(), "capture": capture,
        "workdir": workdir, "uid": ids[0] if ids else None, "gid": ids[1] if ids else None,
        "limits": {"cpu_seconds": lim.cpu_seconds, "memory_bytes": lim.memory_bytes,
                   "file_bytes": lim.file_bytes, "processes": lim.processes,
                   "open_files": lim.open_files, "tmpfs_bytes": lim.tmpfs_bytes},
    }
    cmd = list(command or harness_command())
    if mode == "namespaces":
        cmd = [*UNSHARE, *cmd]
    t0 = time.monotonic()
    try:
        with SPAWN_LOCK:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                                    start_new_session=True)
            HARNESSES.add(proc.pid)
    except OSError as e:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        raise SandboxError(f"cannot start the sandbox: {e}") from e
    finished = False
    try:
        lines, read_status = _collect(proc, json.dumps(job).encode(), nonce, lim, t0, run_seconds)
        finished = read_status == "ok"
    finally:
        _kill_group(proc, EXIT_GRACE if finished else 0.0)
        HARNESSES.discard(proc.pid)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    indices = {str(i) for i in range(plan.total)}  # each test counts once, however often reported
    passed = len({w[1] for w in lines if w[0] == "ok" and len(w) > 1 and w[1] in indices})
    status: Literal["ok", "error", "timeout", "killed", "output_limit"] = read_status
    if status == "ok":
        if any(w[0] == "error" for w in lines):
            status, passed = "error", 0
        elif not any(w[0] == "done" for w in lines):
            status = "killed"
        elif any(w[0] == "timeout" for w in lines):
            status = "timeout"
    slow = [w[1] for w in lines if w[0] == "timeout" and len(w) > 1]
    detail = "" if status == "ok" else \
        f"I/O case {slow[0]} over {lim.timeout_seconds:g}s" if slow else f"exit code {proc.returncode}"
    out = [w[1] for w in lines if w[0] == "output" and len(w) > 1 and _HEX.fullmatch(w[1])]  # hex: see the harness
    output = bytes.fromhex(out[-1]).decode("utf-8", "replace") if out else ""
    return ExecResult(passed, plan.total, status, time.monotonic() - t0, mode, detail, output)


def _collect(
    proc: subprocess.Popen[bytes], job: bytes, nonce: str, lim: SandboxLimits, t0: float, run_seconds: float,
) -> tuple[list[list[str]], Literal["ok", "timeout", "output_limit"]]:
    """Feed the job, read result lines until `done`, EOF, the deadline (`run_seconds` after start) or the cap."""
    if proc.stdin is None or proc.stdout is None:
        raise SandboxError("sandbox pipes missing")
    try:
        proc.stdin.write(job)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    buf = b""
    deadline = t0 + run_seconds + STARTUP_ALLOWANCE
    started = False
    done = f"{nonce} done\n".encode()
    status: Literal["ok", "timeout", "output_limit"] = "ok"
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            if not sel.select(timeout=left):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > lim.read_bytes:
                status = "output_limit"
                break
            if not started and f"{nonce} start".encode() in buf:
                started = True
                deadline = min(deadline, time.monotonic() + run_seconds)
            if buf.find(done, max(0, len(buf) - len(chunk) - len(done))) >= 0:
                break  # finished: a process the program left behind may keep the pipe open
    lines = [ln.split()[1:] for ln in buf.decode("utf-8", "replace").splitlines()
             if ln.startswith(nonce + " ") and len(ln.split()) > 1]
    return lines, status


def _kill_group(proc: subprocess.Popen[bytes], grace: float = 0.0) -> None:
    """SIGKILL the sandbox's whole process group (before reaping, so the group id is not reused).

    With `grace`, the sandbox first gets that long to exit by itself: a harness that finished is then
    reaped by `unshare` rather than killed into an orphan that only the host's init can reap (and
    that counts against the sandbox uid's RLIMIT_NPROC until it does)."""
    if grace > 0:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _connect(path: str) -> socket.socket:
    """A connection to the server, retried for `CONNECT_WAIT` seconds while it starts or restarts."""
    deadline, delay = time.monotonic() + CONNECT_WAIT, 0.05
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as e:
            sock.close()
            if time.monotonic() + delay > deadline:
                raise SandboxError(f"no sandbox server at {path} ({SOCKET_ENV}) after {CONNECT_WAIT:g}s: {e}") from e
            time.sleep(delay)
            delay = min(2 * delay, 1.0)
        except OSError:
            sock.close()
            raise


def run_remote(
    path: str, code: str, plan: TestPlan, lim: SandboxLimits, run_seconds: float, capture: int = 0,
) -> ExecResult:
    """Run `code` in the sandbox server listening on `path` (Unix socket): only the program, its tests,
    the limits (and `capture`, see `run_tests`) cross; nothing of this process's environment does."""
    request = json.dumps({"code": code, "plan": plan.to_json(), "limits": asdict(lim)}
                         | ({"capture": capture} if capture else {})).encode()
    t0 = time.monotonic()
    with _connect(path) as sock:
        sock.settimeout(run_seconds + STARTUP_ALLOWANCE + EXIT_GRACE + REPLY_MARGIN)
        try:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
                if len(reply) > lim.read_bytes:
                    raise SandboxError(f"sandbox server at {path}: reply over {lim.read_bytes} bytes")
        except OSError as e:
            raise SandboxError(f"sandbox server at {path}: {e}") from e
    if not reply:
        raise SandboxError(f"sandbox server at {path} closed the connection without an answer (did it exit?)")
    try:
        data = json.loads(reply)
        if "error" in data:
            raise SandboxError(f"sandbox server at {path}: {data['error']}")
        return ExecResult(int(data["passed"]), int(data["total"]), data["status"], time.monotonic() - t0,
                          "server", str(data.get("detail", "")), str(data.get("output", "")))
    except (ValueError, KeyError, TypeError) as e:
        raise SandboxError(f"sandbox server at {path}: unreadable reply {reply[:200]!r}") from e
