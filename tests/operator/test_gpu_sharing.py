"""How a pod's trainer and rollout share its GPUs (`spec.gpuAllocation`), as the builders write it, and
the sidecars' half of the device-plugin mode (`tandem.sidecars.gpu_share`): tables over both modes,
hybrid and rollout-only pods, CPU jobs; the UUID file and the rollout's wait served over real HTTP."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from wrappers import JobWrapper

from tandem.checkpoint_engine.ports import free_port
from tandem.operator.manifests import builders, gpu_sharing, job_objects
from tandem.sidecars import gpu_share
from tandem.sidecars.gpu import NoUsableGpu
from tandem.spec.podenv import PodEnv


def pods(gpus: int, allocation: str = "devicePlugin") -> list[dict[str, Any]]:
    job = JobWrapper("demo").replicas(1).rollout_only(1).gpus(gpus).job()
    job.spec.gpu_allocation = allocation  # type: ignore[assignment]
    job.spec.gpu_device_class_name = "gpu.example.com"
    return builders.build_pods(job, owner_uid="uid-1")


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]}


def view(c: dict[str, Any]) -> tuple[str | None, str | None, str | None, list[str], bool]:
    """(nvidia.com/gpu requested, NVIDIA_VISIBLE_DEVICES, TANDEM_GPU_IDS_FILE, claims, gpu-ids mounted)"""
    env = {e["name"]: e.get("value") for e in c["env"]}
    res = c.get("resources", {})
    assert res.get("limits", {}).get("nvidia.com/gpu") == res.get("requests", {}).get("nvidia.com/gpu")
    return (res.get("requests", {}).get("nvidia.com/gpu"), env.get("NVIDIA_VISIBLE_DEVICES"),
            env.get(PodEnv.var("gpu_ids_file")), [x["name"] for x in res.get("claims", [])],
            any(m["name"] == gpu_sharing.IDS_VOLUME for m in c["volumeMounts"]))


IDS = gpu_sharing.IDS_FILE
CASES = [  # gpus, mode, pod index, container -> view
    (2, "devicePlugin", 0, "trainer", ("2", None, IDS, [], True)),
    (2, "devicePlugin", 0, "rollout", (None, "all", IDS, [], True)),
    (2, "devicePlugin", 1, "rollout", ("2", None, None, [], False)),  # rollout-only: owns the GPUs
    (2, "dra", 0, "trainer", (None, None, None, ["gpus"], False)),
    (2, "dra", 0, "rollout", (None, None, None, ["gpus"], False)),
    (2, "dra", 1, "rollout", (None, None, None, ["gpus"], False)),
    (0, "dra", 0, "trainer", (None, None, None, [], False)),  # CPU: nothing to share
    (0, "devicePlugin", 0, "rollout", (None, None, None, [], False)),
]


@pytest.mark.parametrize(("gpus", "mode", "index", "name", "want"), CASES)
def test_containers_get_the_gpus_as_the_mode_says(gpus: int, mode: str, index: int, name: str,
                                                  want: tuple[Any, ...]) -> None:
    pod = pods(gpus, mode)[index]
    assert view(containers(pod)[name]) == want
    claims = pod["spec"].get("resourceClaims")
    volumes = [v["name"] for v in pod["spec"]["volumes"]]
    if gpus and mode == "dra":
        assert claims == [{"name": "gpus", "resourceClaimTemplateName": "demo-gpus"}]
    else:
        assert claims is None
    assert (gpu_sharing.IDS_VOLUME in volumes) == (gpus > 0 and mode == "devicePlugin" and index == 0)


def test_the_claim_template_asks_the_device_class_for_each_pods_gpus() -> None:
    job = JobWrapper("demo").gpus(4).job()
    job.spec.gpu_allocation, job.spec.gpu_device_class_name = "dra", "gpu.example.com"
    owner = job_objects.owner_reference("demo", "uid-1")
    t = gpu_sharing.claim_template(job, owner)
    assert (t["apiVersion"], t["kind"], t["metadata"]["name"]) == ("resource.k8s.io/v1", "ResourceClaimTemplate",
                                                                   "demo-gpus")
    assert t["metadata"]["ownerReferences"] == [owner]
    assert t["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.example.com", "allocationMode": "ExactCount",
                                     "count": 4}}]


def test_bad_allocation_fields_name_the_field() -> None:
    job = JobWrapper("demo").gpus(1).job()
    doc = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    for field, value in (("gpuAllocation", "mig"), ("gpuDeviceClassName", "Not_A_Name")):
        with pytest.raises(ValueError, match=field):
            type(job).model_validate({**doc, "spec": {**doc["spec"], field: value}})


UUID_A, UUID_B = "GPU-1b2c3d4e-0000-1111-2222-333344445555", "GPU-99aa88bb-0000-1111-2222-333344445555"


@pytest.mark.parametrize(("environ", "listing", "want"), [
    ({"NVIDIA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"}, "", [UUID_A, UUID_B]),  # the device plugin's default
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, f"GPU 0: NVIDIA H100 (UUID: {UUID_B})\n", [UUID_B]),  # else nvidia-smi -L
    ({}, "", []),
])
def test_trainer_ids(environ: dict[str, str], listing: str, want: list[str]) -> None:
    assert gpu_share.trainer_ids(environ, lambda: listing) == want


def test_rollout_maps_the_trainers_uuids_to_its_own_indices() -> None:
    listing = f"0, GPU-00000000-aaaa-bbbb-cccc-000000000000\n3, {UUID_A}\n5, {UUID_B}\n"
    assert gpu_share.cuda_visible_devices([UUID_B, UUID_A], listing) == "5,3"
    with pytest.raises(NoUsableGpu, match="gpuAllocation: dra"):  # a hardened toolkit mounted nothing
        gpu_share.cuda_visible_devices([UUID_A], "")


def test_rollout_waits_for_the_file_answering_health_meanwhile(tmp_path: Path) -> None:
    path, port = tmp_path / "visible", free_port()
    got: list[list[str]] = []
    waiter = threading.Thread(target=lambda: got.append(gpu_share.wait_for(path, port=port)))
    waiter.start()

    def health() -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return int(r.status)

    for _ in range(100):  # the server comes up in the thread
        try:
            assert health() == 200
            break
        except OSError:
            waiter.join(0.1)
    else:
        pytest.fail("no /health while waiting")
    assert waiter.is_alive(), "it must wait until the trainer has written its GPUs"
    gpu_share.publish(path, [UUID_A, UUID_B])
    waiter.join(30)
    assert got == [[UUID_A, UUID_B]]
    with pytest.raises(OSError):
        health()  # the port is free again for the rollout's own API
    with pytest.raises(NoUsableGpu, match="cannot tell which GPUs"):
        gpu_share.publish(path, [])
