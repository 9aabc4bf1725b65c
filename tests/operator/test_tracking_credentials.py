"""MLflow credentials on a shared cluster: a trackingUri with user:password@ is refused naming the field
and the Secret field instead (offline and in the CRD's rule), never echoing the URI; the builders give
only the trainer container MLFLOW_TRACKING_* by secretKeyRef to `tracking.mlflow.credentialsSecret`, and
nothing of them reaches the job's ConfigMap; `tandem run`'s trainers take them from the invoking shell.
The API server's own CEL rule is checked on the real control plane (k8s)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane
from wrappers import JobWrapper

from tandem.cli.local import processes_for
from tandem.operator.manifests import builders, job_objects, pod_template, tracking_access
from tandem.spec import crd
from tandem.spec.load import SpecError, parse_job

MLFLOW_VARS = set(tracking_access.CREDENTIAL_KEYS.values())


def with_mlflow(uri: str, secret: str | None = "mlflow-creds") -> JobWrapper:
    mlflow: dict[str, Any] = {"trackingUri": uri}
    if secret is not None:
        mlflow["credentialsSecret"] = secret
    return JobWrapper("demo").set("tracking", {"mlflow": mlflow})


@pytest.mark.parametrize("uri", ["http://alice:pw-Kq7@mlflow:5000", "https://alice@mlflow.example.com/",
                                 "http://tok-Kq7@10.0.0.5:5000/prefix"])
def test_a_uri_with_credentials_is_refused_naming_the_secret_field(uri: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(with_mlflow(uri).obj(), "job.yaml")
    assert err.value.fields == ["spec.tracking.mlflow.trackingUri"]
    text = str(err.value)
    assert "must not carry credentials" in text and "tracking.mlflow.credentialsSecret" in text
    assert "Kq7" not in text and "alice" not in text  # the message never shows the URI


@pytest.mark.parametrize("uri", ["http://mlflow:5000", "https://mlflow.example.com/a@b?c=d@e",
                                 "file:///tmp/mlruns@1"])
def test_uris_without_userinfo_pass(uri: str) -> None:
    job = parse_job(with_mlflow(uri).obj())
    assert job.spec.tracking.mlflow is not None and job.spec.tracking.mlflow.tracking_uri == uri


def test_the_crd_refuses_it_too() -> None:
    """The API server's rule sits on the object (a CEL message names a value's type, never the value)."""
    schema = yaml.safe_load(crd.render())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    mlflow = schema["properties"]["spec"]["properties"]["tracking"]["properties"]["mlflow"]
    rules = mlflow["x-kubernetes-validations"]
    assert [r["fieldPath"] for r in rules] == [".trackingUri"]
    assert "matches('^[a-z]+://[^/?#]*@')" in rules[0]["rule"] and "credentialsSecret" in rules[0]["message"]
    assert mlflow["properties"]["credentialsSecret"]["pattern"] == "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


@pytest.mark.k8s
def test_the_api_server_refuses_it_without_echoing_it(installed: ControlPlane) -> None:
    def create(uri: str) -> subprocess.CompletedProcess[str]:
        doc = with_mlflow(uri).meta("name", "creds").obj()
        out: subprocess.CompletedProcess[str] = installed.kubectl("create", "--dry-run=server", "-f", "-",
                                                                  input=json.dumps(doc), check=False)
        return out

    refused = create("http://alice:pw-Kq7@mlflow:5000")
    assert refused.returncode != 0 and "spec.tracking.mlflow.trackingUri" in refused.stderr, refused.stderr
    assert "credentialsSecret" in refused.stderr and "Kq7" not in refused.stderr + refused.stdout
    accepted = create("https://mlflow.example.com/a@b")
    assert accepted.returncode == 0, accepted.stderr


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"].get("initContainers", [])) + list(pod["spec"]["containers"])


def test_only_the_trainer_gets_them_by_secret_key_ref() -> None:
    job = with_mlflow("http://mlflow:5000").replicas(2).rollout_only(1).set(
        "rewards", [{"type": "codeExec"}]).job()  # a sandbox container in each hybrid pod as well
    trainers = 0
    for pod in builders.build_pods(job):
        for c in _containers(pod):
            mine = {e["name"]: e for e in c["env"] if e["name"] in MLFLOW_VARS}
            if c["name"] != "trainer":
                assert not mine, f"{pod['metadata']['name']}/{c['name']} gets {sorted(mine)}"
                continue
            trainers += 1
            assert mine == {var: {"name": var, "valueFrom": {"secretKeyRef": {
                "name": "mlflow-creds", "key": key, "optional": True}}}
                for key, var in tracking_access.CREDENTIAL_KEYS.items()}
    assert trainers == 2
    document = job_objects.build_spec_configmap(job)["data"]["job.yaml"]
    assert "credentialsSecret: mlflow-creds" in document and "@" not in document
    assert "MLFLOW_TRACKING" not in document


def test_no_secret_no_variables_and_no_override() -> None:
    for pod in builders.build_pods(with_mlflow("http://mlflow:5000", secret=None).job()):
        assert not any(e["name"] in MLFLOW_VARS for c in _containers(pod) for e in c["env"])
    clash = with_mlflow("http://mlflow:5000").set("podTemplate", {"spec": {"containers": [
        {"name": "trainer", "env": [{"name": "MLFLOW_TRACKING_PASSWORD", "value": "plain"}]}]}}).job()
    with pytest.raises(pod_template.PodTemplateConflict, match="MLFLOW_TRACKING_PASSWORD is set by the operator"):
        builders.build_pods(clash)


@pytest.mark.parametrize("secret", ["mlflow-creds", None])
def test_tandem_run_trainers_inherit_the_shells_credentials(
    secret: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw-from-shell")
    job = with_mlflow("http://mlflow:5000", secret).gpus(0).set("rewards", [{"type": "codeExec"}]).job()
    procs = processes_for(builders.build_pods(job), job, tmp_path, "http://127.0.0.1:2379", token="t",
                          shm_root=tmp_path / "shm")
    by_name = {p.name: p for p in procs}
    assert by_name["trainer"].env["MLFLOW_TRACKING_USERNAME"] == "alice"
    assert by_name["trainer"].env["MLFLOW_TRACKING_PASSWORD"] == "pw-from-shell"
    assert not MLFLOW_VARS & set(by_name["sandbox"].env)  # the sandbox server gets none of the shell's secrets
    assert "pw-from-shell" not in (tmp_path / "job.yaml").read_text()


def test_the_wandb_api_key_reaches_only_the_trainer_by_secret_key_ref(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W&B's API key as MLflow's credentials: WANDB_API_KEY by secretKeyRef in the trainer alone, nothing of
    it in the job's document; `tandem run`'s trainer takes the shell's."""
    job = JobWrapper("demo").set("tracking", {"wandb": {"credentialsSecret": "wandb-key", "entity": "lab"}}).replicas(
        2).rollout_only(1).set("rewards", [{"type": "codeExec"}]).job()
    seen = 0
    for pod in builders.build_pods(job):
        for c in _containers(pod):
            mine = [e for e in c["env"] if e["name"].startswith("WANDB_")]
            if c["name"] != "trainer":
                assert not mine, f"{pod['metadata']['name']}/{c['name']} gets {mine}"
                continue
            seen += 1
            assert mine == [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {
                "name": "wandb-key", "key": "apiKey", "optional": True}}}]
    assert seen == 2
    assert "WANDB_API_KEY" not in job_objects.build_spec_configmap(job)["data"]["job.yaml"]
    monkeypatch.setenv("WANDB_API_KEY", "key-from-shell")
    local = JobWrapper("demo").set("tracking", {"wandb": {"credentialsSecret": "wandb-key"}}).gpus(0).job()
    procs = processes_for(builders.build_pods(local), local, tmp_path, "http://127.0.0.1:2379", token="t",
                          shm_root=tmp_path / "shm")
    assert {p.name: p for p in procs}["trainer"].env["WANDB_API_KEY"] == "key-from-shell"
    assert "key-from-shell" not in (tmp_path / "job.yaml").read_text()
