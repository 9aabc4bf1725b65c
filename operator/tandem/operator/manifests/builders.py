"""Pure builders: an RLHFJob spec in, plain Kubernetes manifests (dicts) out.

Callers: the kopf handlers (`tandem.operator.runtime.handlers`, through `tandem.operator.runtime.reconcile`) create
what these return; `tandem run` (the CLI) starts the same pods as local processes from
`build_pods`. Nothing here talks to the API server, reads the clock or the environment.

The job's other objects (Service, spec ConfigMap, token Secret) and every name and label the pods carry:
`job_objects`.

Container contract (stable; the sidecars and `tandem run` rely on it). Commands:
  trainer  ["python", "-m", "tandem.sidecars.trainer"]
  rollout  ["python", "-m", "tandem.sidecars.rollout"]
Environment of both containers: the pod env contract, `tandem.spec.podenv.PodEnv` (one field per
variable, with its meaning), written here with `PodEnv.environ`. Values in a cluster: TANDEM_JOB_FILE
/etc/tandem/job.yaml (the ConfigMap); TANDEM_ETCD_ENDPOINTS spec.checkpointEngine.etcd.endpoints or
the operator's default (the chart's `tandem-etcd` service); TANDEM_SHM_DIR /dev/shm/tandem (an
emptyDir of checkpointEngine.shmSize); TANDEM_CE_PORT checkpointEngine.port for the trainer, port + 1
for the rollout; TANDEM_TOKEN from secretKeyRef `<job>-token`/token; TANDEM_POD_IP from the downward
API; MASTER_ADDR `<job>-0.<job>.<ns>.svc`; TANDEM_RESUME 1 (a recreated pod's driver continues from
the newest checkpoint: its pod shm or the durable store; a first start finds none); TANDEM_JOB_UID the
RLHFJob's metadata.uid when the builders get owner_uid (durable copies live under
`<persist.path>/<ns>/<job>/<uid>/`, so a new job of the same name never resumes an old one's copies,
and its etcd records live under `<job>/<uid>/`); TANDEM_SHARD_PORT checkpointEngine.shardPort (the
rollout's shard server, port `shards`); TANDEM_ETCD_* the job's etcd TLS files and user
(`tandem.operator.manifests.etcd_access`). The trainer also gets MLflow's and W&B's credentials, MLFLOW_TRACKING_* and
WANDB_API_KEY by secretKeyRef (`tandem.operator.manifests.tracking_access`). Both have terminationMessagePolicy
FallbackToLogsOnError. Volumes: the pod's own are `shm` (the emptyDir above) and `job-spec` (the ConfigMap, with
the etcd tlsSecret's files projected beside it). Each
spec.volumes entry `<name>` becomes pod volume `vol-<name>` (the prefix keeps user names apart from
the pod's own), a `persistentVolumeClaim` (claimName, readOnly) or a `hostPath` (type
DirectoryOrCreate), mounted at its mountPath (readOnly as given) in every container of every pod.
Probes: the rollout container (native sidecar or rollout-only) has a startupProbe and a readinessProbe,
GET /health on its checkpoint-engine port (unauthenticated; served once vLLM has loaded the model).
The trainer has none (see `trainer_container`).
GPUs: the trainer requests `nvidia.com/gpu: gpusPerPod` (a rollout-only pod's rollout does); how a
hybrid pod's rollout gets the trainer's devices (a shared file of their UUIDs, or one DRA ResourceClaim
for both with spec.gpuAllocation dra) is `tandem.operator.manifests.gpu_sharing`.
spec.podTemplate (labels, scheduling, pull secrets, service account, extra env/envFrom/volumeMounts
per container; rolloutOnly's scheduling for the rollout-only pods) is merged over each pod last, by
`tandem.operator.manifests.pod_template`; what is named above wins.
Every pod passes Pod Security "restricted" (`tandem.operator.manifests.pod_security`: user 10001, no SA token).
A hybrid pod of a job with a codeExec reward also has a `sandbox` native sidecar (uid 10002, no GPU,
no token) that runs the generated programs, reached by the trainer over a Unix socket in an emptyDir
(TANDEM_SANDBOX_SOCKET; `tandem.operator.manifests.sandbox_pod`).
"""

from __future__ import annotations

from tandem.operator.manifests import (
    etcd_access,
    gpu_sharing,
    kueue,
    pod_security,
    pod_template,
    sandbox_pod,
    tracking_access,
)
from tandem.operator.manifests.job_objects import (
    JOB_FILE_KEY,
    MASTER_PORT,
    ROLE_HYBRID,
    ROLE_ROLLOUT,
    SHARD_PORT_NAME,
    TOKEN_KEY,
    Manifest,
    ce_ports,
    object_metadata,
    pod_count,
    pod_group_name,
    pod_labels,
    pod_name,
    pod_object_name,
    service_name,
    spec_configmap_name,
    token_secret_name,
)
from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv

TRAINER_COMMAND = ["python", "-m", "tandem.sidecars.trainer"]
ROLLOUT_COMMAND = ["python", "-m", "tandem.sidecars.rollout"]
JOB_FILE_DIR = "/etc/tandem"
JOB_FILE = f"{JOB_FILE_DIR}/{JOB_FILE_KEY}"
SHM_MOUNT = "/dev/shm"
SHM_DIR = f"{SHM_MOUNT}/tandem"
VOLUME_PREFIX = "vol-"
HEALTH_PATH = "/health"
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 180  # 30 minutes for the rollout to import vLLM and load the model
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_ETCD_ENDPOINTS = "http://tandem-etcd.tandem-system.svc:2379"
# A sidecar that refuses to start writes its one-line reason to /dev/termination-log; a crash without one
# leaves the tail of its log there instead. Either shows in `kubectl get rlhfjobs` (tandem.operator.policies.observe).
TERMINATION_POLICY = "FallbackToLogsOnError"


def etcd_endpoints(job: RLHFJob, default: str = DEFAULT_ETCD_ENDPOINTS) -> str:
    return ",".join(job.spec.checkpoint_engine.etcd.endpoints) or default


def _env(
    job: RLHFJob, *, role: str, index: int, generation: int, ce_port: int, etcd: str, owner_uid: str | None
) -> list[Manifest]:
    name, ns = job.metadata.name, job.metadata.namespace
    plain = PodEnv.environ(
        job=name, namespace=ns, role=role, pod=pod_name(name, index), pod_index=index,
        replicas=job.spec.replicas, rollout_only=index >= job.spec.replicas, job_file=JOB_FILE,
        etcd_endpoints=etcd, shm_dir=SHM_DIR, port=ce_port,
        master_addr=f"{pod_name(name, 0)}.{service_name(name)}.{ns}.svc", master_port=MASTER_PORT,
        restart_generation=generation, resume=True, shard_port=job.spec.checkpoint_engine.shard_port,
        **({"job_uid": owner_uid} if owner_uid is not None else {}),
    )
    env: list[Manifest] = [{"name": k, "value": v} for k, v in plain.items()]
    env.append({"name": PodEnv.var("token"),
                "valueFrom": {"secretKeyRef": {"name": token_secret_name(name), "key": TOKEN_KEY}}})
    env.append({"name": PodEnv.var("pod_ip"), "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    return env + etcd_access.env(job, JOB_FILE_DIR)


def volume_name(name: str) -> str:
    """Pod volume name of spec.volumes entry `name` (at most 59 chars, so at most 63 with the prefix)."""
    return f"{VOLUME_PREFIX}{name}"


def _mounts(job: RLHFJob) -> list[Manifest]:
    own: list[Manifest] = [
        {"name": "shm", "mountPath": SHM_MOUNT},
        {"name": "job-spec", "mountPath": JOB_FILE_DIR, "readOnly": True},
    ]
    return own + [{"name": volume_name(v.name), "mountPath": v.mount_path, "readOnly": v.read_only}
                  for v in job.spec.volumes]


def _pod_volumes(job: RLHFJob) -> list[Manifest]:
    items = [{"key": JOB_FILE_KEY, "path": JOB_FILE_KEY}]
    out: list[Manifest] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": job.spec.checkpoint_engine.shm_size}},
        etcd_access.job_spec_volume(job, {"name": "job-spec",
                                          "configMap": {"name": spec_configmap_name(job), "items": items}}),
    ]
    for v in job.spec.volumes:
        if v.claim_name is not None:
            source: Manifest = {"persistentVolumeClaim": {"claimName": v.claim_name, "readOnly": v.read_only}}
        else:  # the spec guarantees exactly one of claimName and hostPath
            source = {"hostPath": {"path": v.host_path, "type": "DirectoryOrCreate"}}
        out.append({"name": volume_name(v.name), **source})
    return out


def _health_probe(port: int, *, period: int, failures: int) -> Manifest:
    get = {"path": HEALTH_PATH, "port": port, "scheme": "HTTP"}
    return {"httpGet": get, "periodSeconds": period, "timeoutSeconds": 5, "failureThreshold": failures}


def _resources(cpu: str, memory: str, gpus: int) -> Manifest:
    amounts: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        amounts[GPU_RESOURCE] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def trainer_container(
    job: RLHFJob, index: int, generation: int, etcd: str, owner_uid: str | None = None
) -> Manifest:
    """The trainer. No probes: only pod 0's trainer (the driver) serves the checkpoint-engine API,
    the others run Megatron ranks with no HTTP server, and a failing trainer exits (the pod fails
    and the operator gang-restarts) rather than hanging in a state a probe could detect."""
    port, _ = ce_ports(job)
    res = job.spec.trainer.resources
    return {
        "name": "trainer",
        "image": job.spec.trainer.image,
        "command": list(TRAINER_COMMAND),
        "env": _env(
            job, role="trainer", index=index, generation=generation, ce_port=port, etcd=etcd, owner_uid=owner_uid
        ) + tracking_access.trainer_env(job),  # MLflow's and W&B's credentials by secretKeyRef
        "ports": [
            {"name": "ce-trainer", "containerPort": port, "protocol": "TCP"},
            {"name": "rendezvous", "containerPort": MASTER_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(res.cpu, res.memory, job.spec.gpus_per_pod),
        "volumeMounts": _mounts(job),
        "terminationMessagePolicy": TERMINATION_POLICY,
    }


def rollout_container(
    job: RLHFJob, index: int, generation: int, etcd: str, *, owns_gpus: bool, owner_uid: str | None = None
) -> Manifest:
    """The rollout; it requests the GPUs only when no trainer shares its pod (`owns_gpus`). Its
    startupProbe allows 30 minutes for importing vLLM and loading the model; in a hybrid pod (native
    sidecar) the kubelet starts the trainer only once it passes, as the trainer waits for rollouts anyway."""
    _, port = ce_ports(job)
    res = job.spec.rollout.resources
    env = _env(
        job, role="rollout", index=index, generation=generation, ce_port=port, etcd=etcd, owner_uid=owner_uid
    )
    return {
        "name": "rollout",
        "image": job.spec.rollout.image,
        "command": list(ROLLOUT_COMMAND),
        "env": env,
        "ports": [{"name": "ce-rollout", "containerPort": port, "protocol": "TCP"},
                  {"name": SHARD_PORT_NAME, "containerPort": job.spec.checkpoint_engine.shard_port, "protocol": "TCP"}],
        "resources": _resources(res.cpu, res.memory, job.spec.gpus_per_pod if owns_gpus else 0),
        "volumeMounts": _mounts(job),
        "terminationMessagePolicy": TERMINATION_POLICY,
        "startupProbe": _health_probe(port, period=STARTUP_PERIOD_S, failures=STARTUP_FAILURES),
        "readinessProbe": _health_probe(port, period=10, failures=3),
    }


def build_pod(
    job: RLHFJob,
    index: int,
    *,
    restart_generation: int = 0,
    owner_uid: str | None = None,
    default_etcd: str = DEFAULT_ETCD_ENDPOINTS,
) -> Manifest:
    name = job.metadata.name
    etcd = etcd_endpoints(job, default_etcd)
    hybrid = index < job.spec.replicas
    role = ROLE_HYBRID if hybrid else ROLE_ROLLOUT
    pod_spec: Manifest = {
        "hostname": pod_name(name, index),
        "subdomain": service_name(name),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": False,
        "volumes": _pod_volumes(job),
    }
    if hybrid:
        sidecar = rollout_container(job, index, restart_generation, etcd, owns_gpus=False, owner_uid=owner_uid)
        sidecar["restartPolicy"] = "Always"  # native sidecar: starts first, stops after the trainer
        pod_spec["initContainers"] = [sidecar]
        pod_spec["containers"] = [trainer_container(job, index, restart_generation, etcd, owner_uid)]
    else:
        pod_spec["containers"] = [
            rollout_container(job, index, restart_generation, etcd, owns_gpus=True, owner_uid=owner_uid)
        ]
    if hybrid and job.spec.gang_scheduling:  # the gang's PodGroup (`tandem.operator.manifests.gang`)
        pod_spec["schedulingGroup"] = {"podGroupName": pod_group_name(name, restart_generation)}
    if job.spec.gpus_per_pod:
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    gpu_sharing.attach(pod_spec, job, hybrid=hybrid)  # device plugin + shared UUIDs, or one DRA claim
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": object_metadata(
            job, pod_object_name(name, index, restart_generation, queued=bool(kueue.queue_name(job.metadata.labels))),
            owner_uid, pod_labels(name, role, index, restart_generation)
        ),
        "spec": sandbox_pod.attach(pod_security.restrict(pod_spec), job, trainer=hybrid),  # codeExec sandbox
    }
    pod = pod_template.apply(pod, job, rollout_only=not hybrid)  # spec.podTemplate over all of the above
    return kueue.mark_pod(pod, name, kueue.queue_name(job.metadata.labels), pod_count(job))  # Kueue's pod group


def build_pods(job: RLHFJob, *, restart_generation: int = 0, owner_uid: str | None = None,
               default_etcd: str = DEFAULT_ETCD_ENDPOINTS) -> list[Manifest]:
    """Every pod of the job, hybrid pods first, in index order."""
    return [
        build_pod(
            job, i, restart_generation=restart_generation, owner_uid=owner_uid, default_etcd=default_etcd
        )
        for i in range(pod_count(job))
    ]
