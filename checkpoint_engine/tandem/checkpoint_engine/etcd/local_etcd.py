"""A private etcd server process on loopback, or a cluster of them: for `tandem run` and the tests.

Role: start/stop/restart a real etcd (Debian's etcd-server, or any binary passed in) with its own
data dir and free ports; `LocalEtcdCluster` starts several members that form one cluster (each
with its own client and peer ports and data dir). Callers: `tandem.cli.local` (the job's metadata
store on one machine), tests/conftest.py (the session's etcd) and the member-loss test
(tests/checkpoint_engine/test_etcd_failover.py). In a cluster the chart's etcd is used instead.
With `tls_dir` a member serves https only and asks every client for a certificate signed by the
directory's CA (`--client-cert-auth`; files ca.crt, server.crt, server.key, and client.crt/.key for
its own health check): tests/checkpoint_engine/test_etcd_security.py.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from tandem.checkpoint_engine.ports import free_port

__all__ = ["EtcdNotFound", "LocalEtcd", "LocalEtcdCluster", "free_port"]


class EtcdNotFound(RuntimeError):
    pass


class LocalEtcd:
    """One etcd member on 127.0.0.1; `endpoint` is its client URL. Alone by default; a member of
    a cluster when `name`, `peer_port` and `initial_cluster` (name=peer-url,...) are given."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        binary: str | None = None,
        name: str = "tandem",
        peer_port: int | None = None,
        initial_cluster: str | None = None,
        tls_dir: Path | None = None,
    ):
        found = binary or shutil.which("etcd")
        if found is None:
            raise EtcdNotFound("etcd binary not found: run scripts/setup.sh (installs Debian's etcd-server)")
        self.binary = found
        self.data_dir = data_dir
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.tls_dir = tls_dir
        self.endpoint = f"{'https' if tls_dir else 'http'}://{self.host}:{self.port}"
        self.name, self.peer_port, self.initial_cluster = name, peer_port, initial_cluster
        self.log_path = data_dir.parent / f"etcd-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> LocalEtcd:
        """(Re)start on the same port and data dir; returns once it answers requests."""
        self.launch()
        self.wait_healthy(timeout)
        return self

    def launch(self) -> None:
        """Start the process without waiting (members of a cluster answer only once a quorum runs)."""
        self.stop()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        peer_url = f"http://127.0.0.1:{self.peer_port or free_port()}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--data-dir", str(self.data_dir), "--name", self.name,
                 "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", self.initial_cluster or f"{self.name}={peer_url}", *self._tls_args()],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_healthy(self, timeout: float = 20.0) -> None:
        """Return once the member answers requests (it has a leader); raise naming its log if not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"etcd exited with {code}; see {self.log_path}")
            if self._healthy():
                return
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not listen on {self.endpoint} within {timeout}s; see {self.log_path}")

    def _tls_args(self) -> list[str]:
        d = self.tls_dir
        if d is None:
            return []
        return ["--client-cert-auth", "--trusted-ca-file", str(d / "ca.crt"),
                "--cert-file", str(d / "server.crt"), "--key-file", str(d / "server.key")]

    def _healthy(self) -> bool:
        """etcd answers requests (not just accepts connections): its /health endpoint says so."""
        ctx = None
        if self.tls_dir is not None:
            ctx = ssl.create_default_context(cafile=str(self.tls_dir / "ca.crt"))
            ctx.load_cert_chain(self.tls_dir / "client.crt", self.tls_dir / "client.key")
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1, context=ctx) as r:  # noqa: S310
                return bool(json.loads(r.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalEtcdCluster:
    """`size` etcd members on 127.0.0.1 forming one cluster; `endpoints` are their client URLs."""

    def __init__(self, root: Path, size: int = 3, *, binary: str | None = None):
        peers = [free_port() for _ in range(size)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
        self.members = [
            LocalEtcd(root / f"m{i}" / "data", binary=binary, name=f"m{i}", peer_port=p, initial_cluster=initial)
            for i, p in enumerate(peers)
        ]
        self.endpoints = [m.endpoint for m in self.members]

    def start(self, timeout: float = 60.0) -> LocalEtcdCluster:
        """Start every member, then wait until each answers (a quorum has elected a leader)."""
        for m in self.members:
            m.launch()
        deadline = time.monotonic() + timeout
        for m in self.members:
            m.wait_healthy(max(1.0, deadline - time.monotonic()))
        return self

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def __enter__(self) -> LocalEtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
