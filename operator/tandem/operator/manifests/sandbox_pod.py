"""The `sandbox` container of a pod whose job runs model-written programs: pure, pod spec in, pod spec out.

Which pods: every hybrid pod of a job with a codeExec reward (its trainer scores programs), and every pod of
a job whose rollout.environment offers the `python` tool (its rollout runs the model's programs as tool
calls); the containers that send programs (`trainer`, `rollout`) mount the socket.

Caller: `tandem.operator.manifests.builders.build_pod`, after `pod_security.restrict` (this container carries
its own, stricter context) and before spec.podTemplate is merged (which names only `trainer` and
`rollout`, so it never reaches this container).

The trainer scores codeExec rewards by sending each program to a sandbox server
(`tandem.sidecars.sandbox.sandbox_server`) over a Unix socket in an emptyDir that only these two
containers mount. The server's container is where the programs run, so it gets nothing worth
stealing: the trainer image and the server's command; uid/gid 10002 (not the trainer's 10001, so
the trainer's files, /proc entries and processes are out of its reach) and Pod Security
"restricted" (no privilege escalation, every capability dropped, RuntimeDefault seccomp) with a
read-only root filesystem, writable only in the socket emptyDir and a tmpfs emptyDir at /tmp; no
GPU (it requests none, and NVIDIA_VISIBLE_DEVICES=void hides them from the NVIDIA runtime even
where an image sets `all`), no token, no Secret, no job volume, no job spec, and only
TANDEM_SANDBOX_SOCKET of the pod env contract. It is a native sidecar (an init container with
restartPolicy Always, after the rollout): the kubelet restarts it should a program bring it down,
and the trainer's client retries its socket meanwhile. PID 1 of its own container (pods do not share
a process namespace), it cannot be killed by a signal its programs send.
"""

from __future__ import annotations

from typing import Any

from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv

Manifest = dict[str, Any]
CONTAINER = "sandbox"
COMMAND = ["python", "-m", "tandem.sidecars.sandbox.sandbox_server"]
SOCKET_VOLUME, SCRATCH_VOLUME = "sandbox-socket", "sandbox-tmp"
SOCKET_DIR = "/run/tandem-sandbox"
SOCKET = f"{SOCKET_DIR}/sandbox.sock"
RUN_AS = 10002
CPU, MEMORY = "2", "4Gi"  # per pod: a few programs at a time, 1 GiB address space each
# tmpfs: a program that fills it gets ENOSPC (a disk emptyDir over its sizeLimit would evict the whole pod)
SCRATCH = "256Mi"


def scores_code(job: RLHFJob) -> bool:
    """The trainer runs programs: a codeExec reward."""
    return any(r.type == "codeExec" for r in job.spec.rewards)


def runs_tool_code(job: RLHFJob) -> bool:
    """The rollout runs programs: the python tool of rollout.environment."""
    env = job.spec.rollout.environment
    return env is not None and env.type == "tools" and "python" in env.tools


def wanted(job: RLHFJob) -> bool:
    return scores_code(job) or runs_tool_code(job)


def security_context() -> Manifest:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def container(job: RLHFJob) -> Manifest:
    return {
        "name": CONTAINER,
        "image": job.spec.trainer.image,
        "command": list(COMMAND),
        "env": [*({"name": k, "value": v} for k, v in PodEnv.environ(sandbox_socket=SOCKET).items()),
                # no GPU even where an image or a runtime default would expose all (NVIDIA container toolkit)
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        "resources": {"requests": {"cpu": CPU, "memory": MEMORY}, "limits": {"cpu": CPU, "memory": MEMORY}},
        "volumeMounts": [{"name": SOCKET_VOLUME, "mountPath": SOCKET_DIR},
                         {"name": SCRATCH_VOLUME, "mountPath": "/tmp"}],
        "securityContext": security_context(),
        "restartPolicy": "Always",
    }


def attach(pod_spec: Manifest, job: RLHFJob, *, trainer: bool) -> Manifest:
    """`pod_spec` (in place; returned) with the sandbox container, its volumes, and the mount and
    TANDEM_SANDBOX_SOCKET of the containers that send it programs: the trainer (a hybrid pod's, with a
    codeExec reward) and the rollout (with the python tool)."""
    senders = {"trainer"} if trainer and scores_code(job) else set()
    if runs_tool_code(job):
        senders.add("rollout")
    if not senders:
        return pod_spec
    pod_spec.setdefault("initContainers", []).append(container(job))
    pod_spec.setdefault("volumes", []).extend([
        {"name": SOCKET_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": SCRATCH_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": SCRATCH}},
    ])
    for c in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:  # the rollout: a native sidecar
        if c["name"] in senders:
            c.setdefault("volumeMounts", []).append({"name": SOCKET_VOLUME, "mountPath": SOCKET_DIR})
            c.setdefault("env", []).extend({"name": k, "value": v}
                                           for k, v in PodEnv.environ(sandbox_socket=SOCKET).items())
    return pod_spec
