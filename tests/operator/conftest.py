"""Fixtures of the operator tests: one real control plane per session, the chart installed from its
rendered manifests, and the operator running with the chart ServiceAccount's credentials.

Everything here is session-scoped and lazy: unit tests of the builders and policies never start
the control plane. Tests that need it are marked `k8s`; without the binaries they skip with a reason
naming scripts/build-k8s.sh, unless scripts/test.sh is building them beside the suite (a fresh machine's
`make test`): then the first of them waits for that build to end, and fails with its log if it failed.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # controlplane, harness, wrappers (also for bench/)

from controlplane import ControlPlane, ControlPlaneError, missing_binaries  # noqa: E402
from harness import (  # noqa: E402
    MANIFESTS,
    OperatorProcess,
    namespace_doc,
    service_account_kubeconfig,
    wait_for,
)

BUILD_WAIT_S = 3600.0  # the Go build beside the suite: ~10 minutes alone on 2 cores


def wait_for_build() -> None:
    """Wait for scripts/test.sh's build of the control plane (TANDEM_K8S_BUILD_RC: a file written with its
    exit status when it ends); fail naming its log if it failed or did not end within BUILD_WAIT_S."""
    rc_file, log = os.environ.get("TANDEM_K8S_BUILD_RC"), os.environ.get("TANDEM_K8S_BUILD_LOG", "?")
    if not rc_file:
        return
    wait_for(f"the control plane's build (scripts/build-k8s.sh, log {log}) to end",
             lambda: os.path.exists(rc_file), BUILD_WAIT_S, every=2.0)
    rc = Path(rc_file).read_text().strip()
    if rc != "0":
        tail = "".join(Path(log).read_text(errors="replace").splitlines(keepends=True)[-20:]) \
            if os.path.exists(log) else ""
        pytest.fail(f"the control plane's build (scripts/build-k8s.sh) exited {rc}; the end of {log}:\n{tail}")


@pytest.fixture(scope="session")
def k8s() -> Iterator[ControlPlane]:
    """etcd 3.6 + kube-apiserver (RBAC) + controller-manager + scheduler + kwok with 4 GPU nodes."""
    wait_for_build()
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Kubernetes binaries missing ({', '.join(missing)}): run scripts/build-k8s.sh")
    cp = ControlPlane(nodes=4)
    try:
        cp.start()
    except ControlPlaneError:
        cp.stop(keep=True)
        raise
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def installed(k8s: ControlPlane) -> ControlPlane:
    """manifests/tandem.yaml applied for real (namespace, CRD, RBAC, ServiceAccount, Deployment, etcd)."""
    k8s.kubectl("apply", "-f", str(MANIFESTS / "tandem.yaml"))
    k8s.kubectl("wait", "--for=condition=Established", "crd/rlhfjobs.tandem.dev", "--timeout=60s")
    return k8s


@pytest.fixture(scope="session")
def operator_kubeconfig(installed: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return service_account_kubeconfig(installed, tmp_path_factory.mktemp("operator") / "sa.kubeconfig")


@pytest.fixture(scope="session")
def operator(
    installed: ControlPlane,
    operator_kubeconfig: Path,
    etcd_server: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The operator as a subprocess, with the chart ServiceAccount's token and the test etcd."""
    log = tmp_path_factory.mktemp("operator-log") / "operator.log"
    from controlplane import free_port

    proc = OperatorProcess(operator_kubeconfig, etcd_server.endpoint, log, metrics_port=free_port()).start()
    yield proc
    proc.stop()
    print(f"operator log tail:\n{proc.tail(60)}")


@pytest.fixture
def ns(installed: ControlPlane) -> Iterator[str]:
    """A fresh namespace per test; deleted afterwards (without waiting)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    installed.apply(namespace_doc(name))
    wait_for(
        f"default ServiceAccount in {name}",
        lambda: installed.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    installed.kubectl("delete", "namespace", name, "--wait=false", check=False)
