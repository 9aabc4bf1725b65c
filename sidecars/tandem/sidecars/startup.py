"""Common start of both sidecar entry points: logging, SIGTERM handling, the pod env and the job.

Role: read the `TANDEM_*` variables into the typed contract (`tandem.spec.podenv.PodEnv`) and the
job file they name, and the etcd credentials they carry (`etcd_security`). Callers:
`python -m tandem.sidecars.trainer` and `python -m tandem.sidecars.rollout`.
"""

from __future__ import annotations

import logging
import signal

from tandem.checkpoint_engine.etcd_security import EtcdSecurity
from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv, PodEnvError


def exit_on_sigterm() -> None:
    """Turn SIGTERM (kubelet, `tandem run` shutdown) into SystemExit so `finally` blocks run."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def start_sidecar(log: logging.Logger) -> tuple[PodEnv, RLHFJob] | None:
    """Logging, SIGTERM handling, env and job; None (after logging why) when the env or job file is bad."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    exit_on_sigterm()
    try:
        env = PodEnv.from_environ()
        return env, env.load_job()
    except (PodEnvError, ValueError) as e:
        log.error("%s", e)
        return None


def etcd_security(env: PodEnv) -> EtcdSecurity:
    """TLS files and etcd user of the pod env (the job's etcd.tlsSecret and etcd.authSecret)."""
    def text(p: object) -> str | None:
        return None if p is None else str(p)

    return EtcdSecurity(ca_file=text(env.etcd_ca_file), cert_file=text(env.etcd_cert_file),
                        key_file=text(env.etcd_key_file), username=env.etcd_username, password=env.etcd_password)
