"""The sandbox container (`tandem.operator.manifests.sandbox_pod`) in the built pods and in `tandem run`.

Hybrid pods of jobs with a codeExec reward get it, and every pod of a job with the python tool; it runs as
its own uid under a restricted, read-only context, with no GPU, no token and no job volume; the trainer
(codeExec) and the rollout (python tool) reach it through the socket emptyDir named in the pod env
contract. `tandem run` gives it an environment of its own.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane
from test_operator_pod_security import labelled_namespace, refused_by_admission
from wrappers import JobWrapper

from tandem.cli import local_sandbox
from tandem.cli.local import processes_for
from tandem.cli.local_procs import stop_all
from tandem.operator.manifests import builders, sandbox_pod
from tandem.sidecars.sandbox.code_tests import parse_tests
from tandem.sidecars.sandbox.runner import SandboxLimits, run_remote
from tandem.spec.podenv import PodEnv

SOCKET_VAR = PodEnv.var("sandbox_socket")


def _code_job() -> JobWrapper:
    return JobWrapper("demo").replicas(2).rollout_only(1).gpus(2).set("rewards", [
        {"type": "codeExec", "timeoutSeconds": 3}, {"type": "answerMatch"}])


def _by_name(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def test_hybrid_pods_of_code_jobs_get_the_sandbox_as_its_own_user() -> None:
    job = _code_job().job()
    hybrid, _, rollout_only = builders.build_pods(job, owner_uid="uid-1")
    assert "sandbox" not in _by_name(rollout_only)  # no trainer there, nothing to score
    spec = hybrid["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["rollout", "sandbox"]
    box, trainer = _by_name(hybrid)["sandbox"], _by_name(hybrid)["trainer"]
    assert box["restartPolicy"] == "Always" and box["image"] == job.spec.trainer.image
    assert box["command"] == ["python", "-m", "tandem.sidecars.sandbox.sandbox_server"]
    ctx = box["securityContext"]
    assert ctx["runAsUser"] == ctx["runAsGroup"] == 10002 != spec["securityContext"]["runAsUser"]
    assert ctx["runAsNonRoot"] and ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"]
    assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert box["env"] == [{"name": SOCKET_VAR, "value": sandbox_pod.SOCKET},  # no token, no contract, no Secret
                          {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]  # and no GPU
    assert builders.GPU_RESOURCE not in box["resources"]["limits"] and "envFrom" not in box
    box_mounts = {m["name"]: m["mountPath"] for m in box["volumeMounts"]}
    assert box_mounts == {"sandbox-socket": sandbox_pod.SOCKET_DIR, "sandbox-tmp": "/tmp"}
    trainer_env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert trainer_env[SOCKET_VAR] == sandbox_pod.SOCKET
    assert {"name": "sandbox-socket", "mountPath": sandbox_pod.SOCKET_DIR} in trainer["volumeMounts"]
    rollout_mounts = {m["name"] for m in _by_name(hybrid)["rollout"]["volumeMounts"]}
    assert "sandbox-socket" not in rollout_mounts
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["sandbox-socket"] and "emptyDir" in volumes["sandbox-tmp"]
    assert PodEnv.from_environ({k: v or "x" for k, v in trainer_env.items()}).sandbox_socket == \
        Path(sandbox_pod.SOCKET)


def test_jobs_without_code_rewards_get_no_sandbox() -> None:
    for pod in builders.build_pods(JobWrapper("demo").replicas(1).rollout_only(1).job()):
        assert "sandbox" not in _by_name(pod)
        assert all(v["name"] != "sandbox-socket" for v in pod["spec"]["volumes"])
        assert all(SOCKET_VAR not in {e["name"] for e in c["env"]} for c in _by_name(pod).values())


def test_the_python_tool_gives_every_pods_rollout_the_sandbox(tmp_path: Path) -> None:
    """The rollout runs the model's programs (the python tool): every pod, rollout-only ones included, gets
    the sandbox, and the rollout its socket; the trainer only where it also scores code."""
    tools = {"type": "tools", "tools": ["calculator", "python"]}
    job = JobWrapper("demo").replicas(2).rollout_only(1).gpus(2).set("rollout.environment", tools).job()
    for pod in builders.build_pods(job, owner_uid="uid-1"):
        by_name = _by_name(pod)
        assert by_name["sandbox"]["securityContext"]["runAsUser"] == 10002
        env = {e["name"]: e.get("value") for e in by_name["rollout"]["env"]}
        assert env[SOCKET_VAR] == sandbox_pod.SOCKET
        assert {"name": "sandbox-socket", "mountPath": sandbox_pod.SOCKET_DIR} in by_name["rollout"]["volumeMounts"]
        if "trainer" in by_name:
            assert SOCKET_VAR not in {e["name"] for e in by_name["trainer"]["env"]}
    both = JobWrapper("demo").replicas(1).set("rollout.environment", tools).set("rewards", [{"type": "codeExec"}]).job()
    [pod] = builders.build_pods(both, owner_uid="uid-1")
    assert all(SOCKET_VAR in {e["name"] for e in _by_name(pod)[c]["env"]} for c in ("rollout", "trainer"))
    assert [c["name"] for c in pod["spec"]["initContainers"]].count("sandbox") == 1
    procs = processes_for([pod], both, tmp_path, "http://127.0.0.1:2379", token="t0k", shm_root=tmp_path / "shm",
                          extra=PodEnv.environ(resume=False, job_uid="u"))
    sockets = {p.name: p.env.get(SOCKET_VAR) for p in procs}
    assert sockets["rollout"] == sockets["trainer"] == sockets["sandbox"] == str(tmp_path / "sandbox" / "demo-0.sock")


def test_tandem_run_gives_the_server_its_own_env_and_the_trainer_its_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    job = _code_job().gpus(0).rollout_only(0).replicas(1).job()
    procs = processes_for(builders.build_pods(job), job, tmp_path, "http://127.0.0.1:2379", token="t0k",
                          shm_root=tmp_path / "shm", extra=PodEnv.environ(resume=False, job_uid="u"))
    by_name = {p.name: p for p in procs}
    assert set(by_name) == {"rollout", "trainer", "sandbox"}
    box, trainer = by_name["sandbox"], by_name["trainer"]
    assert box.argv[1:] == ["-m", "tandem.sidecars.sandbox.sandbox_server"]
    assert box.env[SOCKET_VAR] == trainer.env[SOCKET_VAR] == str(tmp_path / "sandbox" / "demo-0.sock")
    assert not [k for k in box.env if k.startswith("TANDEM_") and k != SOCKET_VAR]
    assert "t0k" not in box.env.values() and "HF_TOKEN" not in box.env
    assert SOCKET_VAR not in by_name["rollout"].env
    deep = tmp_path / ("d" * 100)  # a socket address holds 108 bytes: the socket moves under /tmp
    far = local_sandbox.socket_path(deep, "demo-0")
    assert len(str(far)) < 100 and far == local_sandbox.socket_path(deep, "demo-0")  # the same every run
    assert far.parent.parent == Path(tempfile.gettempdir()) and far.name == "demo-0.sock"


def test_tandem_run_starts_a_server_the_trainer_reaches(tmp_path: Path) -> None:
    """The sandbox process `tandem run` starts (as root: dropping to uid 10002, with the run dir in a
    directory only root may enter) serves the socket the trainer's env names."""
    job = _code_job().gpus(0).rollout_only(0).replicas(1).job()
    procs = processes_for(builders.build_pods(job), job, tmp_path, "http://127.0.0.1:2379", token="t0k",
                          shm_root=tmp_path / "shm", extra=PodEnv.environ(resume=False, job_uid="u"))
    box = next(p for p in procs if p.name == "sandbox")
    sock = Path(next(p for p in procs if p.name == "trainer").env[SOCKET_VAR])
    box.start()
    try:
        deadline = time.monotonic() + 60
        while not sock.is_socket():
            assert box.exit_code() is None, box.tail()
            assert time.monotonic() < deadline, "no socket after 60 s"
            time.sleep(0.05)
        assert box.proc is not None
        tests = parse_tests(["assert f(1) == 2", "assert f(1) == 3"])
        r = run_remote(str(sock), "def f(x):\n    return x + 1\n", tests, SandboxLimits(timeout_seconds=5.0), 5.0)
        assert (r.passed, r.total, r.isolation) == (1, 2, "server")
        if os.geteuid() == 0:
            status = Path(f"/proc/{box.proc.pid}/status").read_text()
            assert next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1] == "10002"
    finally:
        assert stop_all([box], grace=10.0) == []  # SIGTERM is enough: the server stops by itself
    assert box.exit_code() == 0


@pytest.mark.k8s
def test_code_job_pods_pass_restricted_admission(installed: ControlPlane) -> None:
    """The real PodSecurity admission (server-side dry run) admits the pod with its sandbox container."""
    ns = labelled_namespace(installed, "restricted", prefix="sandbox")
    try:
        pod = builders.build_pods(_code_job().replicas(1).rollout_only(0).gpus(0).job())[0]
        pod["metadata"]["namespace"] = ns
        assert "sandbox" in _by_name(pod)
        assert refused_by_admission(installed, pod) == ""
        _by_name(pod)["sandbox"]["securityContext"]["allowPrivilegeEscalation"] = True  # admission is on
        assert 'violates PodSecurity "restricted:latest"' in refused_by_admission(installed, pod)
    finally:
        installed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
