"""Operator-side harness on top of the test control plane: chart rendering, the chart ServiceAccount's
credentials, the operator as a subprocess, polling helpers and etcd access.

Callers: tests/operator/conftest.py (fixtures) and bench/operator_scale.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import yaml
from controlplane import ControlPlane, kubeconfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "tandem"
MANIFESTS = ROOT / "manifests"
RELEASE, OPERATOR_NS = "tandem", "tandem-system"
SERVICE_ACCOUNT = "tandem-operator"
T = TypeVar("T")


def helm(cp: ControlPlane, *args: str) -> str:
    out = subprocess.run(
        [str(cp.bin_dir / "helm"), *args],
        capture_output=True,
        text=True,
        env=cp.env(),
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {out.stderr or out.stdout}")
    return out.stdout


def render_chart(cp: ControlPlane, *values: str) -> str:
    """`helm template` of the chart as manifests/ holds it (release tandem, namespace tandem-system)."""
    sets = [a for v in values for a in ("--set", v)]
    return helm(cp, "template", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--include-crds", *sets)


def namespace_doc(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def render_manifests(cp: ControlPlane) -> str:
    """The text of manifests/tandem.yaml: the namespace, then everything the chart renders."""
    head = (
        "# Generated from helm/tandem by `helm template tandem helm/tandem --namespace tandem-system "
        "--include-crds`\n# (tests/operator/test_operator_chart.py checks it).\n"
        "# Apply: kubectl apply -f manifests/\n"
    )
    return head + yaml.safe_dump(namespace_doc(OPERATOR_NS), sort_keys=False) + render_chart(cp)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60, every: float = 0.25) -> T:
    """Poll until `probe` returns something truthy; fail naming `what` and the last value."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def get_json(cp: ControlPlane, *args: str) -> Any:
    out = cp.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def service_account_kubeconfig(cp: ControlPlane, path: Path) -> Path:
    """A kubeconfig holding a token of the chart's operator ServiceAccount (RBAC applies to it)."""
    token = cp.kubectl("create", "token", SERVICE_ACCOUNT, "-n", OPERATOR_NS, "--duration=24h").stdout.strip()
    path.write_text(
        yaml.safe_dump(kubeconfig(cp.server, cp.pki / "ca.crt", {"token": token}, "tandem-operator"))
    )
    return path


class OperatorProcess:
    """`python -m tandem.operator` as a child process with the given kubeconfig and etcd."""

    def __init__(self, kubeconfig: Path, etcd: str, log: Path, interval: float = 0.5, verbose: bool = True,
                 metrics_port: int = 0, leader: str = "", liveness_port: int = 0,
                 env_extra: dict[str, str] | None = None):
        """leader: run with --leader-elect under this identity (the chart's Lease, short timings)."""
        self.kubeconfig, self.etcd, self.log, self.interval = kubeconfig, etcd, log, interval
        self.metrics_port, self.leader, self.liveness_port = metrics_port, leader, liveness_port
        self.env_extra = dict(env_extra or {})
        self.args = ["--verbose"] if verbose else []
        if leader:
            self.args.append("--leader-elect")
        if liveness_port:
            self.args.append(f"--liveness=http://127.0.0.1:{liveness_port}/healthz")
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        roots = os.pathsep.join(str(ROOT / r) for r in ("operator", "sidecars", "spec", "checkpoint_engine"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "TANDEM_"))}
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            TANDEM_ETCD_ENDPOINTS=self.etcd,
            TANDEM_RECONCILE_INTERVAL=str(self.interval),
            TANDEM_FINALIZER_RETRIES="3",
            TANDEM_METRICS_PORT=str(self.metrics_port),
            PYTHONPATH=roots + os.pathsep + env.get("PYTHONPATH", ""),
        )
        if self.leader:  # seconds: a standby takes an unrenewed Lease after 4, a leader gives up after 3
            env.update(TANDEM_LEADER_NAMESPACE=OPERATOR_NS, TANDEM_LEADER_IDENTITY=self.leader,
                       TANDEM_LEASE_DURATION="4", TANDEM_RENEW_DEADLINE="3", TANDEM_RETRY_PERIOD="0.5")
        env.update(self.env_extra)
        return env

    def start(self) -> OperatorProcess:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tandem.operator", *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=ROOT,
            )
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("operator not started")
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when the operator's node dies under it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> str:
        """The operator's /metrics text (Prometheus exposition format)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:  # noqa: S310
            return str(r.read().decode())

    def tail(self, lines: int = 40) -> str:
        return (
            "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""
        )


def _client(endpoint: str) -> aetcd.Client:
    host, _, port = endpoint.split("://")[-1].partition(":")
    return aetcd.Client(host, int(port or 2379))


def etcd_put(endpoint: str, key: str, value: str) -> None:
    async def go() -> None:
        async with _client(endpoint) as c:
            await c.put(key.encode(), value.encode())

    asyncio.run(go())


def etcd_keys(endpoint: str, prefix: str) -> list[str]:
    async def go() -> list[str]:
        async with _client(endpoint) as c:
            return [kv.key.decode() for kv in await c.get_prefix(prefix.encode())]

    return asyncio.run(go())
