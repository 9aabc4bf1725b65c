"""spec.volumes and checkpointEngine.persist against the real API server: the shipped samples and
valid volume/persist specs are accepted with the expected defaults (an absent persist stays absent),
volumes cannot change once the job exists, and the pods the builders make for such a job pass the
API server's own Pod validation (volume sources, mounts, probes on the native sidecar).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane
from harness import MANIFESTS
from wrappers import JobWrapper

from tandem.operator.manifests import builders

pytestmark = pytest.mark.k8s
W = JobWrapper
SAMPLES = sorted((MANIFESTS / "samples").glob("*.yaml"))


def dry_run(cp: ControlPlane, doc: dict[str, Any], ns: str = "default") -> dict[str, Any]:
    """Create `doc` with a server-side dry run; the object as the API server would store it."""
    doc = {**doc, "metadata": {**doc["metadata"], "namespace": ns}}
    out = cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(doc), check=False)
    assert out.returncode == 0, out.stderr
    stored: dict[str, Any] = json.loads(out.stdout)
    return stored


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_api_server_accepts_every_sample(installed: ControlPlane, sample: Path) -> None:
    doc = yaml.safe_load(sample.read_text())
    stored = dry_run(installed, doc)
    assert stored["metadata"]["name"] == doc["metadata"]["name"] and set(doc["spec"]) <= set(stored["spec"])
    assert ("persist" in stored["spec"]["checkpointEngine"]) == ("persist" in doc["spec"]["checkpointEngine"])


def test_pvc_sample_gets_persist_and_volume_defaults(installed: ControlPlane) -> None:
    stored = dry_run(installed, yaml.safe_load((MANIFESTS / "samples" / "llama-grpo-pvc.yaml").read_text()))
    spec = stored["spec"]
    assert spec["checkpointEngine"]["persist"] == {"path": "/ckpt/tandem", "every": 20, "keep": 2}
    assert [(v["name"], v["readOnly"]) for v in spec["volumes"]] == [("models", True), ("checkpoints", False)]


ACCEPTED: list[tuple[str, Callable[[], JobWrapper], dict[str, Any] | None]] = [
    ("no-volumes-no-persist", lambda: W(), None),
    ("read-only-volume-without-persist", lambda: W().volume("m", "/models", claimName="models", readOnly=True), None),
    (
        "persist-at-the-mount-path",
        lambda: W().volume("c", "/ckpt", hostPath="/srv/ckpt").persist("/ckpt"),
        {"path": "/ckpt", "every": 10, "keep": 2},
    ),
    (
        "persist-on-the-writable-one-of-two",
        lambda: W()
        .volume("m", "/data", claimName="models", readOnly=True)
        .volume("c", "/data/ckpt", claimName="ckpt")
        .persist("/data/ckpt/run", every=5, keep=3),
        {"path": "/data/ckpt/run", "every": 5, "keep": 3},
    ),
    ("persist-null", lambda: W().volume("c", "/ckpt", claimName="c").set("checkpointEngine.persist", None), None),
]


@pytest.mark.parametrize(("case", "build", "persist"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_api_server_accepts_valid_volume_specs(
    installed: ControlPlane, case: str, build: Callable[[], JobWrapper], persist: dict[str, Any] | None
) -> None:
    job = build()
    job.job()  # the offline rules agree
    stored = dry_run(installed, job.meta("name", case).obj())
    assert stored["spec"]["checkpointEngine"].get("persist") == persist
    assert stored["spec"].get("volumes", []) == [
        {"readOnly": False, **v} for v in job.obj()["spec"].get("volumes", [])
    ]


def test_volumes_are_immutable(installed: ControlPlane, ns: str) -> None:
    doc = W("immutable").volume("c", "/ckpt", claimName="ckpt").persist("/ckpt/x").obj()
    doc["metadata"]["namespace"] = ns
    installed.kubectl("create", "-f", "-", input=json.dumps(doc))
    for patch, field in (
        ({"volumes": [{"name": "c", "mountPath": "/ckpt", "claimName": "other"}]}, "volumes"),
        ({"checkpointEngine": {"persist": {"path": "/ckpt/y"}}}, "checkpointEngine"),
    ):
        out = installed.kubectl(
            "patch", "rlhfjob", "immutable", "-n", ns, "--type=merge", "-p", json.dumps({"spec": patch}), check=False
        )
        assert out.returncode != 0 and f"{field} is immutable" in out.stderr, out.stderr


def test_pods_with_volumes_and_probes_pass_pod_validation(installed: ControlPlane, ns: str) -> None:
    job = (
        W("vols", ns)
        .small()
        .rollout_only(1)
        .volume("models", "/models", claimName="models", readOnly=True)
        .volume("ckpt", "/ckpt", hostPath="/var/lib/tandem/ckpt")
        .persist("/ckpt")
        .job()
    )
    for pod in builders.build_pods(job, owner_uid="0f5c1d7e-uid"):
        pod["metadata"].pop("ownerReferences")  # no such owner exists here; not under test
        stored = dry_run(installed, pod, ns)
        spec = stored["spec"]
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["vol-models"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
        assert vols["vol-ckpt"]["hostPath"] == {"path": "/var/lib/tandem/ckpt", "type": "DirectoryOrCreate"}
        rollout = next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "rollout")
        assert rollout["startupProbe"]["httpGet"]["path"] == "/health"
        assert rollout["readinessProbe"]["httpGet"]["port"] == job.spec.checkpoint_engine.port + 1
