"""A real, private Kubernetes control plane for the operator tests and the scale benchmark.

Callers: tests/operator/conftest.py (one per pytest session) and bench/operator_scale.py.
Binaries come from scripts/build-k8s.sh (cached under ~/.cache/tandem/k8s-<version>/bin), Kubernetes
1.36 with the Workload API and gang scheduling switched on (FEATURE_GATES):
etcd 3.6, kube-apiserver (RBAC on, service-account token signing), kube-controller-manager
(garbage collector, service-account and token controllers), kube-scheduler, and kwok (simulated
nodes: pods bound to them become Running; the stages kwok 0.7 ran by default, which the build writes to
kwok-stages.yaml). Everything listens on free loopback ports and lives in a
private temporary directory; `stop()` ends every process it started and removes the directory.
Certificates and the service-account key pair are generated at start (`k8s_pki.write_pki`);
`kubeconfig` holds admin (system:masters) credentials.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from k8s_pki import write_pki

from tandem.checkpoint_engine.ports import free_port

__all__ = ["ControlPlane", "ControlPlaneError", "free_port", "missing_binaries"]

K8S_VERSION = os.environ.get("K8S_VERSION", "v1.36.3")
# The Workload API (scheduling.k8s.io/v1alpha2) and gang scheduling, for spec.gangScheduling: alpha in
# 1.36, so on in every component that reads them (the controller manager runs podgroup-protection).
FEATURE_GATES = "--feature-gates=GenericWorkload=true,GangScheduling=true"
BIN_DIR = (
    Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / f"k8s-{K8S_VERSION}" / "bin"
)
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl", "helm")
KWOK_STAGES = "kwok-stages.yaml"  # kwok's node and pod stages (scripts/build-k8s.sh writes them: 0.7's defaults)


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become ready; the message names it and its log."""


def missing_binaries(bin_dir: Path = BIN_DIR) -> list[str]:
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    return missing + ([] if (bin_dir / KWOK_STAGES).is_file() else [KWOK_STAGES])


def kubeconfig(server: str, ca: Path, user: dict[str, str], name: str = "tandem-test") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}],
    }


def fake_node(
    name: str, gpus: int = 8, cpu: str = "64", memory: str = "512Gi", pods: int = 250
) -> dict[str, Any]:
    amounts = {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {},
        "status": {
            "allocatable": amounts,
            "capacity": amounts,
            "nodeInfo": {"kubeletVersion": "fake", "operatingSystem": "linux", "architecture": "amd64"},
        },
    }


@dataclass
class ControlPlane:
    bin_dir: Path = BIN_DIR
    nodes: int = 4
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tandem-k8s-")))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    api_port: int = 0
    etcd_port: int = 0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
            "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}",
            "HELM_CACHE_HOME": str(self.root / "helm"),
            "HELM_CONFIG_HOME": str(self.root / "helm"),
            "HELM_DATA_HOME": str(self.root / "helm"),
        }

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(kubeconfig),
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}"
            )
        return out

    def apply(self, docs: list[dict[str, Any]] | dict[str, Any], *extra: str) -> str:
        body = yaml.safe_dump_all(docs if isinstance(docs, list) else [docs])
        return self.kubectl("apply", "-f", "-", *extra, input=body).stdout

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed by the child's lifetime
        self.procs[name] = subprocess.Popen(
            [str(self.bin_dir / args[0]), *args[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            start_new_session=True,
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with {proc.returncode}; log {self.root}/{name}.log:\n"
                    f"{self.log_tail(name)}"
                )

    def _wait(self, what: str, ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if ready():
                    return
            except (OSError, ControlPlaneError, subprocess.SubprocessError):
                pass
            time.sleep(0.5)
        raise ControlPlaneError(f"{what} not ready within {timeout}s (logs in {self.root})")

    def _get(self, path: str) -> str:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        with urllib.request.urlopen(self.server + path, context=ctx, timeout=5) as resp:  # noqa: S310
            return str(resp.read().decode())

    def start(self, timeout: float = 240) -> ControlPlane:
        write_pki(self.pki)
        self.etcd_port, peer, self.api_port = free_port(), free_port(), free_port()
        pki = self.pki
        self.kubeconfig.write_text(
            yaml.safe_dump(
                kubeconfig(
                    self.server,
                    pki / "ca.crt",
                    {"client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")},
                )
            )
        )
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                "etcd",
                "--data-dir",
                str(self.root / "etcd"),
                "--name",
                "k8s",
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"k8s=http://127.0.0.1:{peer}",
                "--quota-backend-bytes",
                str(2 * 1024**3),
                "--log-level",
                "warn",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                "kube-apiserver",
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={self.root / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                "--profiling=false",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                FEATURE_GATES,
                "--runtime-config=scheduling.k8s.io/v1alpha2=true",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver", lambda: self._get("/readyz") == "ok", timeout)
        self._spawn(
            "kube-controller-manager",
            [
                "kube-controller-manager",
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",  # no HTTPS endpoint: nothing to race for a port
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                "--use-service-account-credentials=false",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--concurrent-gc-syncs=20",
                FEATURE_GATES,
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                "kube-scheduler",
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                FEATURE_GATES,
                "--v=1",
            ],
        )
        self._spawn(
            "kwok",
            [
                "kwok",
                f"--kubeconfig={self.kubeconfig}",
                f"--config={self.bin_dir / KWOK_STAGES}",
                "--manage-all-nodes=true",
                "--cidr=10.244.0.1/16",
                "--node-ip=10.244.0.1",
            ],
        )
        self.apply([fake_node(f"kwok-node-{i}") for i in range(self.nodes)])
        self._wait("kwok nodes", self._nodes_ready, timeout)
        self._wait(
            "default ServiceAccount",
            lambda: (
                self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0
            ),
            timeout,
        )
        return self

    def _nodes_ready(self) -> bool:
        out = self.kubectl(
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{' '}{end}",
        )
        states = out.stdout.split()
        return len(states) == self.nodes and all(s == "True" for s in states)

    def stop(self, keep: bool = False) -> None:
        """Ends the processes in the reverse of their start: the API server's clients, then the API server, then
        etcd, each after the one before has exited. Signalled all at once, etcd took 7 s to close under the API
        server's open connections and the API server, its storage gone, did not end its shutdown in 30 s: each
        session's stop waited out the 15-second bound, where in order it takes about a second."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)
