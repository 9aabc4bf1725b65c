"""The pod env contract (`tandem.spec.podenv.PodEnv`) against its writers: the operator's builders
(cluster pods) and `tandem run` (local processes). A variable written that no field reads, or a
field that no writer provides, fails here; so does a writer value the reader would refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from wrappers import JobWrapper

from tandem.cli.local import processes_for
from tandem.operator.manifests import builders
from tandem.spec.podenv import (
    CODE_EXEC_ONLY,
    ETCD_SECURITY_ONLY,
    GPU_SHARING_ONLY,
    LOCAL_ONLY,
    PodEnv,
    PodEnvError,
)

CONTRACT_PREFIXES = ("TANDEM_", "MASTER_")


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _pods() -> list[dict[str, Any]]:
    job = JobWrapper("demo").replicas(2).rollout_only(1).gpus(2).job()
    return builders.build_pods(job, restart_generation=2, owner_uid="uid-1")


def test_every_container_gets_exactly_the_cluster_contract() -> None:
    pods = _pods()
    seen = 0
    for pod in pods:
        for c in _containers(pod):
            names = {e["name"] for e in c["env"]}
            written = {n for n in names if n.startswith(CONTRACT_PREFIXES)}
            unknown = written - PodEnv.variables()
            assert not unknown, f"{pod['metadata']['name']}/{c['name']} writes {unknown} that PodEnv does not read"
            missing = PodEnv.variables() - LOCAL_ONLY - ETCD_SECURITY_ONLY - CODE_EXEC_ONLY - GPU_SHARING_ONLY - written
            assert not missing, f"{pod['metadata']['name']}/{c['name']} lacks {missing}"
            seen += 1
    assert seen == 5  # 2 hybrid pods x (trainer + rollout) + 1 rollout-only pod


def test_the_reader_parses_what_the_builders_write(tmp_path: Path) -> None:
    """Plain values straight from the manifests; what a kubelet fills in (secret, pod IP) stubbed."""
    for pod in _pods():
        for c in _containers(pod):
            env = {e["name"]: e.get("value", "resolved-by-kubelet") for e in c["env"]}
            env[PodEnv.var("pod_ip")] = "10.0.0.7"
            parsed = PodEnv.from_environ(env)
            assert parsed.pod == pod["metadata"]["name"] and parsed.restart_generation == 2
            assert parsed.job_uid == "uid-1" and parsed.resume is True
            assert parsed.rollout_only == (pod["metadata"]["name"] == "demo-2")


def test_tandem_run_processes_carry_the_whole_contract(tmp_path: Path) -> None:
    job = JobWrapper("demo").replicas(1).rollout_only(1).gpus(0).job()
    pods = builders.build_pods(job)
    extra = PodEnv.environ(resume=False, job_uid="u-local")
    procs = processes_for(pods, job, tmp_path, "http://127.0.0.1:2379", token="t0k", shm_root=tmp_path / "shm",
                          extra=extra)
    assert len(procs) == 3
    for p in procs:
        want = PodEnv.variables() - ETCD_SECURITY_ONLY - CODE_EXEC_ONLY - GPU_SHARING_ONLY
        assert want <= set(p.env), f"{p.label} lacks {want - set(p.env)}"
        parsed = PodEnv.from_environ(p.env)
        assert parsed.output_dir == tmp_path and parsed.token == "t0k" and parsed.resume is False
        assert parsed.shm_dir == tmp_path / "shm" / p.pod and parsed.pod_ip == "127.0.0.1"
        assert parsed.load_job().metadata.name == "demo"
    assert len({p.env[PodEnv.var("port")] for p in procs}) == 3  # each container its own port


def test_writers_cannot_misspell_or_mistype_a_variable() -> None:
    assert PodEnv.environ(port=8700, rollout_only=True) == {"TANDEM_CE_PORT": "8700", "TANDEM_ROLLOUT_ONLY": "1"}
    with pytest.raises(PodEnvError, match="no field 'ce_port'"):
        PodEnv.environ(ce_port=8700)
    with pytest.raises(PodEnvError, match="TANDEM_POD_INDEX"):
        PodEnv.environ(pod_index="first")


def test_a_jobs_etcd_secrets_reach_every_container_as_files_and_secret_refs() -> None:
    job = JobWrapper("demo").replicas(1).rollout_only(1).gpus(0).job()
    job.spec.checkpoint_engine.etcd.tls_secret = "etcd-client-tls"
    job.spec.checkpoint_engine.etcd.auth_secret = "demo-etcd-user"
    for pod in builders.build_pods(job, owner_uid="uid-1"):
        vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "job-spec")
        tls = next(s["secret"] for s in vol["projected"]["sources"] if "secret" in s)
        assert tls["name"] == "etcd-client-tls"
        assert sorted(i["path"] for i in tls["items"]) == ["etcd/ca.crt", "etcd/tls.crt", "etcd/tls.key"]
        for c in _containers(pod):
            env = {e["name"]: e for e in c["env"]}
            assert ETCD_SECURITY_ONLY <= set(env)
            assert env["TANDEM_ETCD_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "demo-etcd-user",
                                                                                "key": "password"}
            parsed = PodEnv.from_environ({k: e.get("value", "x") for k, e in env.items()})
            assert str(parsed.etcd_key_file) == "/etc/tandem/etcd/tls.key"
            assert parsed.shard_port == job.spec.checkpoint_engine.shard_port


def test_reader_names_the_bad_variable() -> None:
    with pytest.raises(PodEnvError, match="TANDEM_CE_PORT"):
        PodEnv.from_environ({"TANDEM_JOB": "j", "TANDEM_ROLE": "trainer", "TANDEM_POD": "p",
                             "TANDEM_JOB_FILE": "/x", "TANDEM_ETCD_ENDPOINTS": "e:1", "TANDEM_CE_PORT": "http"})
