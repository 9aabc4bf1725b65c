"""A private etcd server process on loopback: for `tandem run` and the test suite.

Role: start/stop/restart a real etcd (Debian's etcd-server, or any binary passed in) with its own
data dir and free ports. Callers: `tandem.cli.local` (the job's metadata store on one machine) and
tests/conftest.py (the session's etcd). In a cluster the chart's etcd is used instead.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from tandem.checkpoint_engine.ports import free_port

__all__ = ["EtcdNotFound", "LocalEtcd", "free_port"]


class EtcdNotFound(RuntimeError):
    pass


class LocalEtcd:
    """One etcd member on 127.0.0.1; `endpoint` is its client URL."""

    def __init__(self, data_dir: Path, *, port: int | None = None, binary: str | None = None):
        found = binary or shutil.which("etcd")
        if found is None:
            raise EtcdNotFound("etcd binary not found: run scripts/setup.sh (installs Debian's etcd-server)")
        self.binary = found
        self.data_dir = data_dir
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.endpoint = f"http://{self.host}:{self.port}"
        self.log_path = data_dir.parent / f"etcd-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> LocalEtcd:
        """(Re)start on the same port and data dir; returns once it answers requests."""
        self.stop()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        peer = free_port()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--data-dir", str(self.data_dir), "--name", "tandem",
                 "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", f"tandem=http://127.0.0.1:{peer}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log_path}")
            if self._healthy():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not listen on {self.endpoint} within {timeout}s; see {self.log_path}")

    def _healthy(self) -> bool:
        """etcd answers requests (not just accepts connections): its /health endpoint says so."""
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as r:  # noqa: S310 - loopback
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
