"""Harness of the broadcast tests: "pods" as processes (tests/transport/pod.py), each with its own
shm dir, on loopback or in a network namespace of its own, against a real etcd.

Callers: conftest.py (fixtures), test_broadcast.py, test_netns.py. `Pods.start` returns a running
pod; `Pod.event()` waits for its next JSON event; `Pods.close` kills every pod.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Empty, Queue
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.versions import layout

POD_SCRIPT = Path(__file__).with_name("pod.py")
REPO = POD_SCRIPT.parents[2]


class Pod:
    def __init__(self, name: str, root: Path, argv: list[str]) -> None:
        self.name, self.root = name, root
        env = dict(os.environ)
        roots = ("checkpoint_engine", "spec", "sidecars", "operator")
        env["PYTHONPATH"] = os.pathsep.join(str(REPO / p) for p in roots)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        if cores := os.environ.get("TANDEM_TEST_EVERY_CORE"):  # a pinned test worker (tests/conftest.py)
            # pods of their own, as on separate nodes: four of them starting on the worker's one core starved
            # each other's 5-second lease keepalives, and versions vanished from etcd mid-test
            with contextlib.suppress(ProcessLookupError):  # already gone: its events say why
                os.sched_setaffinity(self.proc.pid, {int(c) for c in cores.split(",")})
        self.events: Queue[dict[str, Any]] = Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put({"event": "exit"})

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def event(self, timeout: float = 90.0) -> dict[str, Any]:
        try:
            ev = self.events.get(timeout=timeout)
        except Empty:
            tail = "".join(self.stderr[-20:])
            raise AssertionError(f"{self.name}: no event in {timeout}s; stderr: {tail}") from None
        if ev["event"] == "exit":
            raise AssertionError(f"{self.name} exited; stderr: {''.join(self.stderr[-30:])}")
        return ev

    def go(self) -> None:
        """Let a pod started with --wait-go begin receiving."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(10)
            except (subprocess.TimeoutExpired, OSError):
                self.kill()


class Pods:
    """Starts pod processes of one job; `netns` maps a pod name to (namespace, address)."""

    def __init__(self, etcd: str, base: Path, netns: dict[str, tuple[str, str]] | None = None) -> None:
        self.etcd, self.base = etcd, base
        self.job = "bc-" + secrets.token_hex(4)
        self.netns = netns or {}
        self.pods: list[Pod] = []

    def start(self, role: str, name: str, *extra: str) -> Pod:
        root = self.base / name
        argv = [
            sys.executable,
            str(POD_SCRIPT),
            role,
            "--etcd",
            self.etcd,
            "--job",
            self.job,
            "--pod",
            name,
            "--root",
            str(root),
            *extra,
        ]
        if name in self.netns:
            ns, addr = self.netns[name]
            argv = ["ip", "netns", "exec", ns, *argv, "--advertise", addr, "--bind", addr]
        pod = Pod(name, root, argv)
        self.pods.append(pod)
        return pod

    def version_dir(self, pod: Pod, v: int = 1) -> Path:
        return layout.version_dir(pod.root, self.job, v)

    def close(self) -> None:
        for p in self.pods:
            p.kill()


def same_bytes(a: Path, b: Path) -> None:
    """Every file of version dir `a` equals the one in `b` (index and shards), and checksums hold."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), f"{n} differs between {a} and {b}"
    layout.MappedVersion(b).verify_checksums()


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_etcd_ready(endpoint: str, timeout: float = 60.0) -> None:
    """A just-started etcd accepts TCP before it serves gRPC: wait until a lease can be granted."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe = SyncRegistry(endpoint, "test", "probe", "probe", "probe", timeout=5).connect()
            try:
                probe.put_json("/tandem/test-probe", {}, lease=True)
                return
            finally:
                probe.close()
        except errors.RegistryUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
