"""Sandbox server: runs `codeExec` programs under its own uid for a trainer that connects over a Unix socket.

Role: `python -m tandem.sidecars.sandbox.sandbox_server` is the command of the `sandbox` container that
`tandem.operator.manifests.builders` adds to the hybrid pods of jobs with a codeExec reward, and the process
`tandem run` starts beside each trainer. Clients: `runner.run_remote` (the trainer's
`code_exec_reward`, from its reward thread pool), with the socket path from the pod env contract
(`TANDEM_SANDBOX_SOCKET`).

Why a server (the trade-off): the trainer image runs as uid 10001, and a pod under Pod Security
"restricted" has no capability, so the trainer can neither setuid to another user nor, under the
runtime's default seccomp profile, unshare user or network namespaces. A program the trainer runs
itself therefore shares its uid (it could read the trainer's files and /proc/<pid>/environ, with the
job's token, or kill it), its container (GPUs, volumes) and its Secret-fed env. This server runs in
its own container as uid 10002, with no GPU, no token, no Secret and a read-only root, so none of
that is reachable from its programs whatever a kernel layer misses. User namespaces (the
`namespaces` mode, kept for a root caller with `unshare`) would give the same separation inside one
container, but the runtimes' default profiles refuse them to unprivileged pods. A round trip costs a
connect and two JSON messages (measured in docs/security.md).

Per request: the program and its tests arrive as one JSON document (the client then shuts its write
side); the server runs it with `sandbox.run_tests(..., isolation="basic")` — a fresh `python -I -S`
harness in a new session with its own work dir, hard rlimits (CPU, address space, file size,
processes: effective because the uid is the sandbox's alone; open files; no core), the process group
SIGKILLed at the deadline, output caps, and `confine.py` (no_new_privs, seccomp denying sockets,
exec, ptrace, setsid and signals outside the program's group, Landlock where the kernel has it) —
and answers one JSON document (passed, total, status, detail; and output, what the program printed,
when the request asks for it with `capture`: `program.run_program`, the rollout's python tool).
Programs share the server's uid: the seccomp filter keeps them from signalling it or each other,
non-dumpable processes keep /proc closed, and the server re-creates its socket if a program without
Landlock removes it.

Started as root (`tandem run` as root, the tests) it resolves the interpreter and harness the sandbox
user can read and binds its socket, then drops to `--user` (default 10002). Before it serves, a
self-test scores a passing and a failing program; if the confinement cannot be installed here (say,
a machine without a seccomp table) it exits 1 rather than score every program 0.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any

from tandem.sidecars.sandbox.code_tests import TestPlan
from tandem.sidecars.sandbox.runner import (
    HARNESSES,
    SOCKET_ENV,
    SPAWN_LOCK,
    SandboxLimits,
    confine_source,
    harness_command,
    run_tests,
)

log = logging.getLogger("tandem.sandbox_server")
SANDBOX_UID = 10002  # the sandbox container's user (Dockerfile.megatron's trainer is 10001)
MAX_REQUEST = 64 << 20  # bytes of program + tests
MAX_TIMEOUT = 600.0  # the spec's bound on timeoutSeconds
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
REAP_EVERY = 0.5  # seconds between collections of orphaned program processes


def _limits(raw: dict[str, Any]) -> SandboxLimits:
    """The client's limits, only known fields, the time limit within the spec's bound."""
    known = {f.name for f in fields(SandboxLimits)}
    values: dict[str, Any] = {k: v for k, v in raw.items() if k in known and isinstance(v, int | float)}
    values["timeout_seconds"] = min(float(values.get("timeout_seconds", 5.0)), MAX_TIMEOUT)
    return SandboxLimits(**values)


class SandboxServer:
    """Accepts connections on `path`; one thread per request, at most `workers` programs at a time."""

    def __init__(self, path: Path, command: tuple[str, ...], workers: int = 8, work: Path | None = None) -> None:
        self.path = path
        self.work = work
        self.command = command
        self.slots = threading.BoundedSemaphore(workers)
        self.stopping = threading.Event()
        self.listener: socket.socket | None = None
        self.inode = 0

    def bind(self) -> None:
        """Listen on `path` (a stale socket there is replaced), connectable by the trainer's uid."""
        if self.path.is_socket():
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o666)
        sock.listen(64)
        sock.settimeout(1.0)
        old, self.listener, self.inode = self.listener, sock, self.path.stat().st_ino
        if old is not None:
            old.close()

    def _socket_intact(self) -> bool:
        try:
            st = self.path.stat()
        except PermissionError:
            return True  # out of this uid's reach (bound before the drop): out of its programs' reach too
        except OSError:
            return False
        return stat.S_ISSOCK(st.st_mode) and st.st_ino == self.inode

    def serve_forever(self) -> None:
        if self.listener is None:
            self.bind()
        threading.Thread(target=self._reap_forever, daemon=True, name="sandbox-reaper").start()
        log.info("sandbox server on %s as uid %d, harness %s", self.path, os.getuid(), self.command[0])
        while not self.stopping.is_set():
            if not self._socket_intact():
                log.warning("socket %s was removed or replaced: listening anew", self.path)
                try:
                    self.bind()
                except OSError as e:
                    log.error("cannot listen on %s again: %s (still serving the old socket)", self.path, e)
            assert self.listener is not None
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self.stopping.is_set():
                    break
                raise
            threading.Thread(target=self._handle, args=(conn,), daemon=True, name="sandbox-request").start()
        if self.listener is not None:
            self.listener.close()
        with SPAWN_LOCK:
            for pid in list(HARNESSES):  # programs still running: their whole groups
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            if self._socket_intact():
                self.path.unlink()
        except OSError:
            pass  # out of reach after the drop: the next start replaces it
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)

    def _reap_forever(self) -> None:
        """Collect exited processes a killed program left (they are reparented to this server: PID 1 of
        its container, or a subreaper here), else their zombies would count against RLIMIT_NPROC."""
        while not self.stopping.wait(REAP_EVERY):
            reap_orphans()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                reply = self.answer(_read_request(conn))
            except Exception as e:  # a bad request gets its reason back; the server goes on
                reply = {"error": f"{type(e).__name__}: {e}"}
            try:
                conn.sendall(json.dumps(reply).encode())
            except OSError:
                pass  # the client gave up

    def self_test(self) -> str:
        """"" when a passing program scores 1 and a failing one 0 here; else what went wrong."""
        try:
            good = run_tests("x = 1", ["assert x == 1"], SandboxLimits(timeout_seconds=10), isolation="basic",
                             command=self.command)
            bad = run_tests("x = 1", ["assert x == 2"], SandboxLimits(timeout_seconds=10), isolation="basic",
                            command=self.command)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        if (good.score, bad.score) != (1.0, 0.0):
            return f"a passing program scored {good.score} ({good.status} {good.detail}), a failing one {bad.score}"
        return ""

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        lim = _limits(request.get("limits", {}))
        plan = TestPlan.from_json(request["plan"])
        capture = max(int(request.get("capture") or 0), 0)  # run_program: what the program printed comes back
        with self.slots:
            r = run_tests(str(request["code"]), plan, lim, isolation="basic", command=self.command, capture=capture)
        return {"passed": r.passed, "total": r.total, "status": r.status, "seconds": r.seconds, "detail": r.detail,
                **({"output": r.output} if capture else {})}


def reap_orphans() -> int:
    """Reap exited children that are not harnesses `run_tests` is waiting for; returns how many."""
    me, reaped = os.getpid(), 0
    with SPAWN_LOCK:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in HARNESSES:
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            except OSError:
                continue
            if state == "Z" and int(ppid) == me:
                try:
                    os.waitpid(int(entry), os.WNOHANG)
                    reaped += 1
                except ChildProcessError:
                    pass
    return reaped


def _read_request(conn: socket.socket) -> dict[str, Any]:
    conn.settimeout(30.0)
    data = b""
    while chunk := conn.recv(1 << 20):
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError(f"request over {MAX_REQUEST} bytes")
    request = json.loads(data)
    if not isinstance(request, dict):
        raise ValueError("request must be a JSON object")
    return request


def drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise RuntimeError(f"could not drop to uid {uid}")


def prepare(path: Path, user: int | None, workers: int = 8) -> SandboxServer:
    """Everything that needs the starting user (root when `user` is given), then the drop to `user`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    owner = path.parent.stat().st_uid
    if owner not in (0, os.getuid(), user):  # another user's directory could swap the socket under us
        raise SystemExit(f"socket directory {path.parent} belongs to uid {owner}, not to root or this server")
    ids = (user, user) if user is not None else None
    command = harness_command(ids)
    confine_source()  # read (and cached) while the checkout is readable
    work = Path(tempfile.mkdtemp(prefix="tandem-sandbox-"))
    server = SandboxServer(path, command, workers, work)
    # bound before the drop: the sandbox user may not traverse the run directory's parents (/root/...)
    server.bind()
    if ids is not None:
        os.chown(work, *ids)
        if path.parent.stat().st_uid == 0:
            os.chown(path.parent, *ids)
        drop_privileges(*ids)
    tempfile.tempdir = str(work)  # each program's work dir goes here
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # /proc/<pid> of the server is root's: its programs cannot read it
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of killed programs come here, as to PID 1 in a pod
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(work)})
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.sidecars.sandbox.sandbox_server",
                                     description="Run codeExec programs for a trainer, under this uid.")
    parser.add_argument("--socket", default=os.environ.get(SOCKET_ENV),
                        help=f"Unix socket path (default ${SOCKET_ENV})")
    parser.add_argument("--user", type=int, default=None,
                        help=f"uid (and gid) to drop to when started as root (default {SANDBOX_UID})")
    parser.add_argument("--workers", type=int, default=8, help="programs run at the same time")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.socket:
        parser.error(f"--socket or {SOCKET_ENV} is required")
    user = (args.user or SANDBOX_UID) if os.geteuid() == 0 else None
    if user is None and os.getuid() != SANDBOX_UID:
        log.warning("running as uid %d (not root): programs are confined by rlimits, seccomp and Landlock "
                    "but share this user's files and processes unless this uid is the sandbox's alone",
                    os.getuid())
    server = prepare(Path(args.socket), user, args.workers)
    problem = server.self_test()
    if problem:  # every program would score 0 without a word: refuse to serve instead (the pod shows it)
        log.error("sandbox self-test failed: %s", problem)
        return 1

    def stop(*_: object) -> None:
        server.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
