"""The pod environment contract: every `TANDEM_*` variable a pod's containers read, in one place.

Role: the one typed home of the contract between whoever starts a sidecar and the sidecar itself.
Writers: `tandem.operator.manifests.builders` (the pods' env in a cluster) and `tandem run`
(`tandem.cli.local`, which rewrites what a kubelet would provide) build their variables with
`PodEnv.environ(field=value, ...)`, so a misspelt or unknown field fails at once. Readers: the
sidecars (`tandem.sidecars.startup`) parse the process environment with `PodEnv.from_environ()`.
Adding a variable is one edit here; `tests/operator/test_podenv_contract.py` fails if a writer
sets a variable no field reads, or a field is written by nobody.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tandem.spec.load import load_job
from tandem.spec.models import RLHFJob


class PodEnvError(ValueError):
    """The environment (or a writer's values) does not satisfy the contract; names the variables."""


class PodEnv(BaseModel):
    """One container's environment. Field = what the code uses; alias = the variable's name."""

    model_config = ConfigDict(populate_by_name=True, frozen=True)

    job: str = Field(alias="TANDEM_JOB", description="job name")
    namespace: str = Field("default", alias="TANDEM_NAMESPACE", description="job namespace")
    role: str = Field(alias="TANDEM_ROLE", description="trainer | rollout (the container's role)")
    pod: str = Field(alias="TANDEM_POD", description="pod name (`<job>-<i>`)")
    pod_index: int = Field(0, alias="TANDEM_POD_INDEX", description="i")
    replicas: int = Field(1, alias="TANDEM_REPLICAS", description="spec.replicas (pods holding a trainer)")
    rollout_only: bool = Field(False, alias="TANDEM_ROLLOUT_ONLY", description="1 in rollout-only pods, else 0")
    job_file: Path = Field(alias="TANDEM_JOB_FILE", description="the job as YAML (the ConfigMap, mounted)")
    etcd_endpoints: str = Field(alias="TANDEM_ETCD_ENDPOINTS", description="comma-separated etcd endpoints")
    shm_dir: Path = Field(Path("/dev/shm/tandem"), alias="TANDEM_SHM_DIR", description="the pod's shm emptyDir")
    port: int = Field(alias="TANDEM_CE_PORT", description="this container's checkpoint-engine HTTP port")
    token: str = Field("", alias="TANDEM_TOKEN", description="checkpoint-engine API token (the job's Secret)")
    pod_ip: str = Field("127.0.0.1", alias="TANDEM_POD_IP", description="the pod's IP (downward API)")
    master_addr: str = Field("127.0.0.1", alias="MASTER_ADDR", description="torch.distributed rendezvous host")
    master_port: int = Field(29500, alias="MASTER_PORT", description="torch.distributed rendezvous port")
    restart_generation: int = Field(0, alias="TANDEM_RESTART_GENERATION", description="gang restart generation")
    output_dir: Path | None = Field(None, alias="TANDEM_OUTPUT_DIR",
                                    description="local runs only: where metrics.jsonl and exports go")
    resume: bool = Field(False, alias="TANDEM_RESUME", description="1: continue from the newest checkpoint")
    job_uid: str = Field("local", alias="TANDEM_JOB_UID", description="the RLHFJob's metadata.uid")
    gpu_ids_file: Path | None = Field(None, alias="TANDEM_GPU_IDS_FILE", description="hybrid GPU pods with "
                                      "gpuAllocation devicePlugin: the trainer writes its GPU UUIDs there, the "
                                      "rollout waits for them and uses exactly those")
    sandbox_socket: Path | None = Field(None, alias="TANDEM_SANDBOX_SOCKET",
                                        description="codeExec sandbox server's Unix socket (the sandbox container)")
    etcd_ca_file: Path | None = Field(None, alias="TANDEM_ETCD_CA_FILE",
                                      description="CA bundle of etcd's serving certs (etcd.tlsSecret ca.crt)")
    etcd_cert_file: Path | None = Field(None, alias="TANDEM_ETCD_CERT_FILE",
                                        description="etcd client certificate (etcd.tlsSecret tls.crt)")
    etcd_key_file: Path | None = Field(None, alias="TANDEM_ETCD_KEY_FILE",
                                       description="etcd client key (etcd.tlsSecret tls.key)")
    etcd_username: str | None = Field(None, alias="TANDEM_ETCD_USERNAME",
                                      description="etcd user (etcd.authSecret username)")
    etcd_password: str | None = Field(None, alias="TANDEM_ETCD_PASSWORD",
                                      description="etcd password (etcd.authSecret password)")
    shard_port: int = Field(8702, ge=1, le=65_535, alias="TANDEM_SHARD_PORT",
                            description="port of the pod's shard server (checkpointEngine.shardPort)")

    @classmethod
    def var(cls, field: str) -> str:
        """The variable name of `field` (KeyError naming it when there is no such field)."""
        info = cls.model_fields.get(field)
        if info is None or info.alias is None:
            raise KeyError(f"PodEnv has no field {field!r}")
        return info.alias

    @classmethod
    def variables(cls) -> set[str]:
        """Every variable name the sidecars read."""
        return {cls.var(f) for f in cls.model_fields}

    @classmethod
    def environ(cls, **values: str | int | bool | Path) -> dict[str, str]:
        """`{VARIABLE: text}` for some fields, each value checked against its field's type.

        Writers use this instead of spelling variable names: an unknown field or a value of the
        wrong type raises `PodEnvError` naming it. Booleans are written "1"/"0".
        """
        out: dict[str, str] = {}
        for field, value in values.items():
            try:
                name = cls.var(field)
            except KeyError as e:
                raise PodEnvError(str(e.args[0])) from None
            text = ("1" if value else "0") if isinstance(value, bool) else str(value)
            info = cls.model_fields[field]
            try:
                cls.__pydantic_validator__.validate_assignment(cls.model_construct(), field, text)
            except ValidationError as e:
                raise PodEnvError(f"{name}={text!r}: {e.errors()[0]['msg']} (field {field} of "
                                  f"{info.annotation})") from None
            out[name] = text
        return out

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> PodEnv:
        """Parse the process environment (or `environ`); empty values count as unset."""
        env = dict(os.environ if environ is None else environ)
        try:
            return cls.model_validate({k: v for k, v in env.items() if v != ""})
        except ValidationError as e:
            names = ", ".join(f"{'.'.join(map(str, err['loc']))} ({err['msg']})" for err in e.errors())
            raise PodEnvError(f"bad pod environment: {names}") from None

    @property
    def address(self) -> str:
        """host:port where this sidecar's checkpoint-engine API listens, as others reach it."""
        return f"{self.pod_ip}:{self.port}"

    def load_job(self) -> RLHFJob:
        return load_job(self.job_file)


# Variables only `tandem run` writes (no cluster pod has them); the contract test reads this.
LOCAL_ONLY = frozenset({PodEnv.var("output_dir")})
# Written only for jobs naming checkpointEngine.etcd.tlsSecret (the files) or authSecret (the user).
ETCD_SECURITY_ONLY = frozenset(PodEnv.var(f"etcd_{f}") for f in ("ca_file", "cert_file", "key_file", "username",
                                                                  "password"))
# Written only to the trainer and sandbox containers of jobs with a codeExec reward.
CODE_EXEC_ONLY = frozenset({PodEnv.var("sandbox_socket")})
# Written only to the trainer and rollout of hybrid pods with gpusPerPod > 0 and gpuAllocation devicePlugin.
GPU_SHARING_ONLY = frozenset({PodEnv.var("gpu_ids_file")})
