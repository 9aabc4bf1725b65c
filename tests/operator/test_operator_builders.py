"""Table-driven tests of the pure builders (spec -> Service, ConfigMap, Secret, Pods)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from wrappers import JobWrapper

from tandem.operator.manifests import builders, job_objects
from tandem.spec.load import parse_job

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


@pytest.mark.parametrize(
    ("replicas", "rollout_only", "names", "roles"),
    [
        (1, 0, ["demo-0"], ["hybrid"]),
        (2, 0, ["demo-0", "demo-1"], ["hybrid", "hybrid"]),
        (1, 2, ["demo-0", "demo-1", "demo-2"], ["hybrid", "rollout", "rollout"]),
        (3, 1, ["demo-0", "demo-1", "demo-2", "demo-3"], ["hybrid", "hybrid", "hybrid", "rollout"]),
    ],
)
def test_pod_names_and_roles(replicas: int, rollout_only: int, names: list[str], roles: list[str]) -> None:
    pods = builders.build_pods(JobWrapper().replicas(replicas).rollout_only(rollout_only).job())
    assert [p["metadata"]["name"] for p in pods] == names
    assert [p["metadata"]["labels"][job_objects.LABEL_ROLE] for p in pods] == roles
    assert [p["metadata"]["labels"][job_objects.LABEL_INDEX] for p in pods] == [
        str(i) for i in range(len(names))
    ]


@pytest.mark.parametrize(
    ("gpus", "trainer_gpu", "rollout_gpu", "nvidia_env"),
    [
        (8, "8", None, "all"),
        (4, "4", None, "all"),
        (0, None, None, None),
    ],
)
def test_hybrid_pod_gpus_requested_once(
    gpus: int, trainer_gpu: str | None, rollout_gpu: str | None, nvidia_env: str | None
) -> None:
    pod = builders.build_pods(JobWrapper().gpus(gpus).job())[0]
    c = containers(pod)
    assert c["trainer"]["resources"]["limits"].get(builders.GPU_RESOURCE) == trainer_gpu
    assert c["trainer"]["resources"]["requests"].get(builders.GPU_RESOURCE) == trainer_gpu
    assert c["rollout"]["resources"]["limits"].get(builders.GPU_RESOURCE) == rollout_gpu
    assert env_of(c["rollout"]).get("NVIDIA_VISIBLE_DEVICES") == nvidia_env
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(c["trainer"])
    assert ("tolerations" in pod["spec"]) == bool(gpus)


def test_rollout_is_a_native_sidecar_and_trainer_the_main_container() -> None:
    spec = builders.build_pods(JobWrapper().job())[0]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["rollout"]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["trainer"]
    assert spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["command"] == ["python", "-m", "tandem.sidecars.trainer"]
    assert spec["initContainers"][0]["command"] == ["python", "-m", "tandem.sidecars.rollout"]


@pytest.mark.parametrize("gpus", [8, 2])
def test_rollout_only_pod_holds_only_the_rollout_and_owns_the_gpus(gpus: int) -> None:
    pod = builders.build_pods(JobWrapper().rollout_only(1).gpus(gpus).job())[1]
    spec = pod["spec"]
    assert "initContainers" not in spec
    assert [c["name"] for c in spec["containers"]] == ["rollout"]
    rollout = spec["containers"][0]
    assert rollout["resources"]["limits"][builders.GPU_RESOURCE] == str(gpus)
    env = env_of(rollout)
    assert env["TANDEM_ROLLOUT_ONLY"] == "1" and env["TANDEM_ROLE"] == "rollout"
    assert "NVIDIA_VISIBLE_DEVICES" not in env


@pytest.mark.parametrize(
    ("container", "role", "port"), [("trainer", "trainer", "9100"), ("rollout", "rollout", "9101")]
)
def test_env_contract(container: str, role: str, port: str) -> None:
    job = JobWrapper("qwen", "team-a").replicas(2).rollout_only(1).set("checkpointEngine.port", 9100).job()
    pod = builders.build_pods(job, restart_generation=3)[1]
    env = env_of(containers(pod)[container])
    assert env["TANDEM_JOB"] == "qwen" and env["TANDEM_NAMESPACE"] == "team-a"
    assert env["TANDEM_ROLE"] == role
    assert env["TANDEM_POD"] == "qwen-1" and env["TANDEM_POD_INDEX"] == "1"
    assert env["TANDEM_REPLICAS"] == "2" and env["TANDEM_ROLLOUT_ONLY"] == "0"
    assert env["TANDEM_JOB_FILE"] == "/etc/tandem/job.yaml"
    assert env["TANDEM_SHM_DIR"] == "/dev/shm/tandem"
    assert env["TANDEM_CE_PORT"] == port
    assert env["MASTER_ADDR"] == "qwen-0.qwen.team-a.svc" and env["MASTER_PORT"] == "29500"
    assert env["TANDEM_RESTART_GENERATION"] == "3"
    assert env["TANDEM_TOKEN"] == {"secretKeyRef": {"name": "qwen-token", "key": "token"}}
    assert env["TANDEM_ETCD_ENDPOINTS"] == builders.DEFAULT_ETCD_ENDPOINTS
    assert env["TANDEM_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}


@pytest.mark.parametrize(
    ("endpoints", "default", "expected"),
    [
        ([], "http://e:2379", "http://e:2379"),
        (["http://a:2379"], "http://e:2379", "http://a:2379"),
        (["http://a:2379", "http://b:2379"], "http://e:2379", "http://a:2379,http://b:2379"),
    ],
)
def test_etcd_endpoints(endpoints: list[str], default: str, expected: str) -> None:
    pod = builders.build_pods(JobWrapper().etcd(*endpoints).job(), default_etcd=default)[0]
    assert {env_of(c)["TANDEM_ETCD_ENDPOINTS"] for c in containers(pod).values()} == {expected}


@pytest.mark.parametrize("shm", ["64Gi", "512Mi", "1.5Gi"])
def test_shm_is_memory_backed_with_size_limit(shm: str) -> None:
    pod = builders.build_pods(JobWrapper().set("checkpointEngine.shmSize", shm).job())[0]
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": shm}
    for c in containers(pod).values():
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts["/dev/shm"]["name"] == "shm"
        assert mounts["/etc/tandem"] == {"name": "job-spec", "mountPath": "/etc/tandem", "readOnly": True}
    assert vols["job-spec"]["configMap"]["name"] == job_objects.build_spec_configmap(JobWrapper().set(
        "checkpointEngine.shmSize", shm).job())["metadata"]["name"]


def test_ports_and_resources_follow_the_spec() -> None:
    job = (
        JobWrapper()
        .set("checkpointEngine.port", 8800)
        .set("checkpointEngine.shardPort", 9000)
        .set("trainer.resources", {"cpu": "4", "memory": "8Gi"})
        .set("rollout.resources", {"cpu": "2", "memory": "4Gi"})
        .job()
    )
    c = containers(builders.build_pods(job)[0])
    assert {p["name"]: p["containerPort"] for p in c["trainer"]["ports"]} == {
        "ce-trainer": 8800,
        "rendezvous": 29500,
    }
    assert {p["name"]: p["containerPort"] for p in c["rollout"]["ports"]} == {"ce-rollout": 8801, "shards": 9000}
    service = {p["name"]: p["port"] for p in job_objects.build_service(job)["spec"]["ports"]}
    assert service == {"rendezvous": 29500, "ce-trainer": 8800, "ce-rollout": 8801, "shards": 9000}
    env = {e["name"]: e.get("value") for e in c["rollout"]["env"]}
    assert env["TANDEM_SHARD_PORT"] == "9000"
    assert c["trainer"]["resources"]["requests"] == {"cpu": "4", "memory": "8Gi", builders.GPU_RESOURCE: "8"}
    assert c["rollout"]["resources"]["requests"] == {"cpu": "2", "memory": "4Gi"}


@pytest.mark.parametrize("owner_uid", [None, "1234-uid"])
def test_owner_references_and_labels(owner_uid: str | None) -> None:
    job = JobWrapper().job()
    objs = [
        *builders.build_pods(job, restart_generation=2, owner_uid=owner_uid),
        job_objects.build_service(job, owner_uid=owner_uid),
        job_objects.build_spec_configmap(job, owner_uid=owner_uid),
        job_objects.build_token_secret(job, "t", owner_uid=owner_uid),
    ]
    for obj in objs:
        meta = obj["metadata"]
        assert meta["labels"][job_objects.LABEL_JOB] == "demo" and meta["namespace"] == "default"
        if owner_uid is None:
            assert "ownerReferences" not in meta
        else:
            assert meta["ownerReferences"] == [
                {
                    "apiVersion": "tandem.dev/v1alpha1",
                    "kind": "RLHFJob",
                    "name": "demo",
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
    assert objs[0]["metadata"]["labels"][job_objects.LABEL_GENERATION] == "2"


def test_service_is_headless_and_selects_every_pod_of_the_job() -> None:
    svc = job_objects.build_service(JobWrapper().set("checkpointEngine.port", 9000).job())
    assert svc["metadata"]["name"] == "demo"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {job_objects.LABEL_JOB: "demo"}
    assert sorted(p["port"] for p in svc["spec"]["ports"]) == [8702, 9000, 9001, 29500]  # 8702: shardPort
    pod = builders.build_pods(JobWrapper().job())[0]
    assert pod["spec"]["subdomain"] == "demo" and pod["spec"]["hostname"] == "demo-0"


def test_configmap_holds_the_job_that_parses_back_to_the_same_spec() -> None:
    job = JobWrapper("round", "ns1").replicas(2).set("algorithm.name", "ppo").job()
    cm = job_objects.build_spec_configmap(job)
    assert cm["metadata"]["name"].startswith("round-spec-") and cm["immutable"] is True
    back = parse_job(yaml.safe_load(cm["data"]["job.yaml"]))
    assert back.spec == job.spec and back.metadata.name == "round" and back.metadata.namespace == "ns1"


def test_token_secret_and_fresh_tokens_differ() -> None:
    secret = job_objects.build_token_secret(JobWrapper().job(), "abc")
    assert secret["metadata"]["name"] == "demo-token" and secret["stringData"] == {"token": "abc"}
    tokens = {job_objects.new_token() for _ in range(20)}
    assert len(tokens) == 20 and all(len(t) >= 40 for t in tokens)


def test_longest_job_name_gives_valid_dns_labels() -> None:
    name = "j" * 48
    job = JobWrapper(name).replicas(64).rollout_only(64).job()
    for pod in builders.build_pods(job):
        assert DNS_LABEL.match(pod["metadata"]["name"]) and DNS_LABEL.match(pod["spec"]["hostname"])
    assert DNS_LABEL.match(job_objects.build_service(job)["metadata"]["name"])
    assert len(job_objects.token_secret_name(name)) <= 253


def test_builders_are_pure() -> None:
    job = JobWrapper().replicas(2).rollout_only(1).job()
    before = job.model_dump()
    assert builders.build_pods(job, owner_uid="u") == builders.build_pods(job, owner_uid="u")
    assert job.model_dump() == before


def volume_job(rollout_only: int = 1) -> Any:
    return (
        JobWrapper()
        .replicas(2)
        .rollout_only(rollout_only)
        .volume("models", "/models", claimName="models-pvc", readOnly=True)
        .volume("ckpt", "/ckpt", hostPath="/var/lib/tandem")
        .volume("shm", "/scratch", hostPath="/tmp/scratch")  # a user name that equals the pod's own
        .persist("/ckpt/durable")
        .job()
    )


@pytest.mark.parametrize("index", [0, 1, 2])  # hybrid, hybrid, rollout-only
def test_user_volumes_are_prefixed_and_sourced(index: int) -> None:
    vols = {v["name"]: v for v in builders.build_pods(volume_job())[index]["spec"]["volumes"]}
    own = ["shm", "job-spec"] + (["gpu-ids"] if index < 2 else [])  # a hybrid GPU pod's shared GPU UUIDs
    assert list(vols) == [*own, "vol-models", "vol-ckpt", "vol-shm"]
    assert vols["vol-models"] == {
        "name": "vol-models",
        "persistentVolumeClaim": {"claimName": "models-pvc", "readOnly": True},
    }
    host = {"path": "/var/lib/tandem", "type": "DirectoryOrCreate"}
    assert vols["vol-ckpt"] == {"name": "vol-ckpt", "hostPath": host}
    assert vols["vol-shm"]["hostPath"]["path"] == "/tmp/scratch"
    assert vols["shm"]["emptyDir"]["medium"] == "Memory"  # the pod's own shm is untouched


@pytest.mark.parametrize(
    ("index", "container"), [(0, "trainer"), (0, "rollout"), (1, "trainer"), (1, "rollout"), (2, "rollout")]
)
def test_every_container_mounts_every_volume(index: int, container: str) -> None:
    pod = builders.build_pods(volume_job())[index]
    mounts = {m["mountPath"]: m for m in containers(pod)[container]["volumeMounts"]}
    assert mounts["/models"] == {"name": "vol-models", "mountPath": "/models", "readOnly": True}
    assert mounts["/ckpt"] == {"name": "vol-ckpt", "mountPath": "/ckpt", "readOnly": False}
    assert mounts["/scratch"]["name"] == "vol-shm"
    assert mounts["/dev/shm"]["name"] == "shm" and mounts["/etc/tandem"]["name"] == "job-spec"
    pod_volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert {m["name"] for m in mounts.values()} == pod_volumes


def test_no_volumes_means_only_the_pods_own() -> None:
    pod = builders.build_pods(JobWrapper().job())[0]
    own = ["shm", "job-spec", "gpu-ids"]  # gpu-ids: the trainer's GPU UUIDs for the rollout (gpu_sharing)
    assert [v["name"] for v in pod["spec"]["volumes"]] == own
    for c in containers(pod).values():
        assert [m["name"] for m in c["volumeMounts"]] == own


def test_longest_volume_name_gives_a_valid_pod_volume_name() -> None:
    job = JobWrapper().volume("v" * 59, "/data", claimName="c").job()
    names = [v["name"] for v in builders.build_pods(job)[0]["spec"]["volumes"]]
    assert all(DNS_LABEL.match(n) for n in names) and len(names[-1]) == 63


@pytest.mark.parametrize(("index", "container"), [(0, "rollout"), (1, "rollout")])
def test_rollout_has_startup_and_readiness_probes_on_its_port(index: int, container: str) -> None:
    job = JobWrapper().rollout_only(1).set("checkpointEngine.port", 9300).job()
    rollout = containers(builders.build_pods(job)[index])[container]
    for probe in ("startupProbe", "readinessProbe"):
        assert rollout[probe]["httpGet"] == {"path": "/health", "port": 9301, "scheme": "HTTP"}
    startup = rollout["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60  # vLLM import + model load
    assert rollout["readinessProbe"]["failureThreshold"] < startup["failureThreshold"]
    assert "livenessProbe" not in rollout


def test_trainer_has_no_probes() -> None:
    trainer = containers(builders.build_pods(JobWrapper().replicas(2).job())[1])["trainer"]
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(trainer)


@pytest.mark.parametrize(("owner_uid", "expected"), [(None, None), ("5e0c-uid", "5e0c-uid")])
def test_resume_and_job_uid_env(owner_uid: str | None, expected: str | None) -> None:
    for pod in builders.build_pods(JobWrapper().replicas(2).rollout_only(1).job(), owner_uid=owner_uid):
        for c in containers(pod).values():
            env = env_of(c)
            assert env["TANDEM_RESUME"] == "1"
            assert env.get("TANDEM_JOB_UID") == expected
            names = [e["name"] for e in c["env"]]
            assert len(names) == len(set(names))


def test_the_job_document_is_named_by_its_content() -> None:
    """A changed document is a new, immutable ConfigMap that the pods built after it mount; the operator
    never patches one (its RBAC has no ConfigMap verb but create)."""
    def name_of(w: JobWrapper) -> tuple[str, str]:
        job = w.job()
        pod = builders.build_pods(job)[-1]
        mounted = next(v for v in pod["spec"]["volumes"] if v["name"] == "job-spec")["configMap"]["name"]
        return job_objects.build_spec_configmap(job)["metadata"]["name"], mounted

    one, mounted = name_of(JobWrapper().rollout_only(1))
    assert one == mounted and one == name_of(JobWrapper().rollout_only(1))[0]
    scaled, mounted = name_of(JobWrapper().rollout_only(2))
    assert scaled == mounted and scaled != one and len(scaled) <= 253
