"""The sandbox as a pod runs it: the trainer as uid 10001, the sandbox server as uid 10002, no root anywhere.

A real "trainer" process (started as root, it imports the rewards, then setuid 10001) holds a secret in
its environment and in a private file (mode 0600 in a 0700 directory it owns), and scores programs
through the real sandbox server (conftest.py: it drops to uid 10002 itself) from a thread pool, as
the driver does. Every escape a program tries must fail, and the trainer must outlive them all.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_procs import SANDBOX_UID, uid_of, uid_or_none, wait_for

from tandem.sidecars.sandbox.confine import landlock_abi

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as uids 10001 and 10002: needs root")
TRAINER_UID = 10001
SECRET = "tandem-secret-7f3a9c"

# Runs as the trainer: reads {"programs": [[code, tests, timeout]...]} on stdin, scores them with
# code_exec-style calls from a thread pool, prints [[passed, total, status, seconds]...].
CLIENT = r"""
import ctypes, json, os, sys
from concurrent.futures import ThreadPoolExecutor
libc = ctypes.CDLL(None)
from tandem.sidecars.sandbox.runner import SandboxLimits, harness_command, run_tests
uid, mode = int(sys.argv[1]), sys.argv[2]
command = harness_command((uid, uid)) if mode == "basic" else None  # an interpreter this uid can read
os.setgroups([]); os.setgid(uid); os.setuid(uid)
assert os.getuid() == uid and os.geteuid() == uid
libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: as a trainer started as this uid is
job = json.loads(sys.stdin.read())
def one(p):
    code, tests, timeout = p
    r = run_tests(code.replace("TRAINER_PID", str(os.getpid())), tests, SandboxLimits(timeout_seconds=timeout),
                  isolation=None if mode == "server" else mode, command=command)
    return [r.passed, r.total, r.status, r.seconds, r.isolation]
with ThreadPoolExecutor(4) as pool:
    print(json.dumps(list(pool.map(one, job["programs"]))))
"""


@pytest.fixture()
def trainer_home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="tandem-trainer-home-"))
    (home / "secret.txt").write_text(SECRET)
    os.chown(home, TRAINER_UID, TRAINER_UID)
    os.chown(home / "secret.txt", TRAINER_UID, TRAINER_UID)
    home.chmod(0o700)
    (home / "secret.txt").chmod(0o600)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def run_as_trainer(sock: Path | None, programs: list[tuple[str, Any, float]]) -> list[list[Any]]:
    """Results of `programs` scored by a trainer process of uid 10001: through the server at `sock`, or
    with none (the "basic" mode: the harness under the trainer's own uid)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path), "TANDEM_TOKEN": SECRET, "HF_TOKEN": SECRET,
           **({"TANDEM_SANDBOX_SOCKET": str(sock)} if sock else {})}
    mode = "server" if sock else "basic"
    proc = subprocess.run([sys.executable, "-c", CLIENT, str(TRAINER_UID), mode],
                          input=json.dumps({"programs": programs}), capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, f"the trainer died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    results: list[list[Any]] = json.loads(proc.stdout)
    assert all(r[4] == mode for r in results)
    return results


class Listener:
    """A TCP and a UDP socket on 127.0.0.1 recording whatever reaches them."""

    def __init__(self) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.got: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        self.tcp.settimeout(0.1)
        self.udp.settimeout(0.1)
        while not self.stop.is_set():
            for s, kind in ((self.tcp, "tcp"), (self.udp, "udp")):
                try:
                    if kind == "tcp":
                        conn, _ = s.accept()
                        conn.close()
                    else:
                        s.recv(512)
                    self.got.append(kind)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.tcp.close()
        self.udp.close()


def held(code: str) -> str:
    """`code` sets `escaped`; the program must run to the end (score 1.0) with escaped False."""
    return ("import os\nescaped = False\n\ndef readable(path):\n    try:\n        return open(path, errors='replace')"
            ".read()\n    except OSError:\n        return ''\n\n" + code)


def attempt(expr: str) -> str:
    return f"try:\n    escaped = bool({expr}) or escaped\nexcept Exception:\n    pass\n"


def test_every_escape_held_with_trainer_and_server_non_root(
    sandbox_server: tuple[Path, subprocess.Popen[bytes]], trainer_home: Path,
) -> None:
    sock, server = sandbox_server
    assert uid_of(server.pid) == SANDBOX_UID
    net = Listener()
    outside = Path("/tmp") / f"tandem-escape-{os.getpid()}.txt"
    secret_file = trainer_home / "secret.txt"
    ok_tests = ["assert not escaped"]
    environ_scan = f"any({SECRET!r} in readable(f'/proc/{{p}}/environ') for p in os.listdir('/proc') if p.isdigit())"
    programs: list[tuple[str, Any, float]] = [
        (held(attempt(f"{SECRET!r} in open({str(secret_file)!r}).read()")), ok_tests, 5.0),
        (held(attempt("os.listdir(" + repr(str(trainer_home)) + ")")), ok_tests, 5.0),
        (held(attempt(f"{SECRET!r} in readable('/proc/TRAINER_PID/environ')")
              + attempt(f"{SECRET!r} in readable('/proc/%d/environ' % os.getppid())") + attempt(environ_scan)),
         ok_tests, 5.0),
        (held("import signal\n" + attempt("os.kill(TRAINER_PID, signal.SIGKILL) or True")
              + attempt("os.kill(os.getppid(), signal.SIGKILL) or True")
              + attempt("os.kill(-1, signal.SIGKILL) or True")),
         ok_tests, 5.0),
        (held("import socket\n" + attempt(f"socket.create_connection(('127.0.0.1', {net.tcp.getsockname()[1]}), 1)")
              + attempt(f"socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', "
                        f"{net.udp.getsockname()[1]}))")
              + attempt("socket.getaddrinfo('example.com', 53)")
              + attempt("socket.socket(socket.AF_UNIX).connect(" + repr(str(sock)) + ") or True")), ok_tests, 5.0),
        (held(attempt(f"open({str(outside)!r}, 'w').write('x')") + attempt(f"open({str(trainer_home / 'w')!r}, 'w')")),
         ok_tests, 5.0),
        ("x = bytearray(8 * 1024 ** 3)\n", ["assert len(x) > 0"], 2.0),
        ("import os\nwhile True:\n    os.fork()\n", ["assert True"], 2.0),
        ("while True:\n    pass\n", ["assert True"], 1.0),
        ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", ["assert True"], 2.0),
        ("import os, time\nif os.fork() == 0:\n    try:\n        os.setsid()\n    except OSError:\n        pass\n"
         "    time.sleep(120)\nwhile True:\n    pass\n", ["assert True"], 1.0),
        ("def add(a, b):\n    return a + b\n", ["assert add(1, 2) == 3", "assert add(2, 2) == 4"], 5.0),
        ("def add(a, b):\n    return a - b\n", ["assert add(1, 2) == 3", "assert add(2, 2) == 4"], 5.0),
    ]
    t0 = time.monotonic()
    try:
        results = run_as_trainer(sock, programs)
    finally:
        net.close()
    wall = time.monotonic() - t0
    scores = [(r[0] / r[1] if r[1] else 0.0) for r in results]
    names = ["trainer's file", "trainer's dir", "environ via /proc", "kill trainer/server", "network", "write outside",
             "memory", "fork bomb", "endless loop", "output flood", "left behind", "passing", "failing"]
    got = dict(zip(names, scores, strict=True))
    assert got == {**dict.fromkeys(names[:6], 1.0), **dict.fromkeys(names[6:11], 0.0), "passing": 1.0,
                   "failing": 0.0}, results
    assert results[8][2] == "timeout" and results[8][3] < 6
    assert net.got == [] and not outside.exists() and not (trainer_home / "w").exists()
    assert server.poll() is None  # the server survived every program
    assert wall < 120

    def stray() -> list[int]:
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != server.pid
                and uid_or_none(int(p)) == SANDBOX_UID]
    wait_for(lambda: not stray(), 10, "no process of the sandbox uid but the server")


def test_server_listens_again_when_its_socket_is_removed(
    sandbox_server: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    """A program of the server's uid could unlink the socket where Landlock is missing (it refuses
    that here): the server notices, listens anew, and the trainer's next request is answered."""
    sock, server = sandbox_server
    code = held(attempt(f"os.unlink({str(sock)!r}) or True"))
    assert run_as_trainer(sock, [(code, ["assert not escaped"], 2.0)])[0][:2] == [1, 1]
    sock.unlink()  # what such a program would do
    assert run_as_trainer(sock, [("x = 1", ["assert x == 1"], 2.0)])[0][:2] == [1, 1]
    assert server.poll() is None


@pytest.mark.skipif(not landlock_abi(), reason="without Landlock a program of the trainer's own uid reads its files")
def test_without_a_server_landlock_and_seccomp_hold_the_trainers_uid(trainer_home: Path) -> None:
    """No server ("basic" mode, the harness as the trainer's uid 10001): the three escapes a review found
    at this uid (its files, its environ through /proc, killing it) are held by Landlock and seccomp."""
    ok_tests = ["assert not escaped"]
    programs: list[tuple[str, Any, float]] = [
        (held(attempt(f"{SECRET!r} in open({str(trainer_home / 'secret.txt')!r}).read()")), ok_tests, 5.0),
        (held(attempt(f"{SECRET!r} in readable('/proc/TRAINER_PID/environ')")
              + attempt(f"{SECRET!r} in readable('/proc/%d/environ' % os.getppid())")), ok_tests, 5.0),
        (held("import signal\n" + attempt("os.kill(TRAINER_PID, signal.SIGKILL) or True")
              + attempt("os.kill(-1, signal.SIGKILL) or True")), ok_tests, 5.0),
        ("def add(a, b):\n    return a + b\n", ["assert add(1, 2) == 3"], 5.0),
    ]
    assert [r[0] / r[1] for r in run_as_trainer(None, programs)] == [1.0, 1.0, 1.0, 1.0]
