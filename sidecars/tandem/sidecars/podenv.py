"""The environment contract between the operator's pod builders and the sidecar processes.

Role: read the `TANDEM_*` variables (set by `tandem.operator.builders` in a cluster, rewritten by
`tandem run` on one machine) into one typed object. Callers: `python -m tandem.sidecars.trainer`
and `python -m tandem.sidecars.rollout`.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from tandem.checkpoint_engine.endpoints import split_endpoints
from tandem.spec.load import load_job
from tandem.spec.models import RLHFJob


class PodEnvError(RuntimeError):
    pass


class PodEnv(BaseModel):
    job: str = Field(alias="TANDEM_JOB")
    namespace: str = Field("default", alias="TANDEM_NAMESPACE")
    role: str = Field(alias="TANDEM_ROLE")
    pod: str = Field(alias="TANDEM_POD")
    pod_index: int = Field(0, alias="TANDEM_POD_INDEX")
    replicas: int = Field(1, alias="TANDEM_REPLICAS")
    rollout_only: bool = Field(False, alias="TANDEM_ROLLOUT_ONLY")
    job_file: Path = Field(alias="TANDEM_JOB_FILE")
    etcd_endpoints: str = Field(alias="TANDEM_ETCD_ENDPOINTS")
    shm_dir: Path = Field(Path("/dev/shm/tandem"), alias="TANDEM_SHM_DIR")
    port: int = Field(alias="TANDEM_CE_PORT")
    token: str = Field("", alias="TANDEM_TOKEN")
    pod_ip: str = Field("127.0.0.1", alias="TANDEM_POD_IP")
    master_addr: str = Field("127.0.0.1", alias="MASTER_ADDR")
    master_port: int = Field(29500, alias="MASTER_PORT")
    restart_generation: int = Field(0, alias="TANDEM_RESTART_GENERATION")
    output_dir: Path | None = Field(None, alias="TANDEM_OUTPUT_DIR")
    resume: bool = Field(False, alias="TANDEM_RESUME")
    job_uid: str = Field("local", alias="TANDEM_JOB_UID")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> PodEnv:
        env = dict(os.environ if environ is None else environ)
        try:
            return cls.model_validate({k: v for k, v in env.items() if v != ""})
        except ValidationError as e:
            names = ", ".join(f"{'.'.join(map(str, err['loc']))} ({err['msg']})" for err in e.errors())
            raise PodEnvError(f"bad pod environment: {names}") from None

    @property
    def etcd(self) -> list[str]:
        return split_endpoints(self.etcd_endpoints)

    @property
    def address(self) -> str:
        """host:port where this sidecar's checkpoint-engine API listens, as others reach it."""
        return f"{self.pod_ip}:{self.port}"

    def load_job(self) -> RLHFJob:
        return load_job(self.job_file)


def exit_on_sigterm() -> None:
    """Turn SIGTERM (kubelet, `tandem run` shutdown) into SystemExit so `finally` blocks run."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def start_sidecar(log: logging.Logger) -> tuple[PodEnv, RLHFJob] | None:
    """Common start of both sidecar entry points: logging, SIGTERM handling, env and job.

    Returns None (after logging why) when the environment or the job file is bad.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    exit_on_sigterm()
    try:
        env = PodEnv.from_environ()
        return env, env.load_job()
    except (PodEnvError, ValueError) as e:
        log.error("%s", e)
        return None
