"""Common start of both sidecar entry points: logging, SIGTERM handling, the pod env and the job.

Role: read the `TANDEM_*` variables into the typed contract (`tandem.spec.podenv.PodEnv`) and the
job file they name. Callers: `python -m tandem.sidecars.trainer` and `python -m tandem.sidecars.rollout`.
"""

from __future__ import annotations

import logging
import signal

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
