"""Common start of both sidecar entry points: logging, SIGTERM handling, the pod env and the job, the
exit (`leave`).

Role: read the `TANDEM_*` variables into the typed contract (`tandem.spec.podenv.PodEnv`) and the
job file they name, and the etcd credentials they carry (`etcd_security`). A sidecar that cannot
start (`refuse`) logs one line and leaves it as the container's termination message, which the
operator shows in the job's status (`tandem.operator.policies.observe`). `freeze_start_up` ends a sidecar's start-up
for the garbage collector. Callers: `python -m tandem.sidecars.trainer` (its loop, `trainer.loop.driver`) and
`python -m tandem.sidecars.rollout`.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
from pathlib import Path
from typing import NoReturn

from tandem.checkpoint_engine.etcd.security import EtcdSecurity
from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv, PodEnvError


def freeze_start_up() -> None:
    """Collect once, then move every object alive now (start-up's: modules, the model, vLLM's client) to the
    collector's permanent generation (`gc.freeze`): each later collection walks only what the sidecar
    allocated since (the trainer's: 0.21 s per full collection before, under a millisecond after). Called
    once, when start-up is over."""
    gc.collect()
    gc.freeze()


def exit_on_sigterm() -> None:
    """Turn SIGTERM (kubelet, `tandem run` shutdown) into SystemExit so `finally` blocks run. Only the first: the
    sidecar is then on its way out, and a second SystemExit would break off the `finally` blocks the first runs."""

    def stop(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def leave(code: int) -> NoReturn:
    """Exit a sidecar whose main returned. SIGTERM is ignored from here on: the interpreter's exit runs finalizers
    (weakref.finalize, atexit), and a SystemExit raised inside one is printed as an ignored exception's traceback
    while the process exits anyway (a `tandem run` or kubelet stop that lands as the sidecar finishes)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(code)


# Where the kubelet reads a container's termination message (the default terminationMessagePath); it
# exists only in a pod, so `tandem run` and tests leave it alone.
TERMINATION_LOG = Path("/dev/termination-log")
TERMINATION_BYTES = 4096  # the kubelet keeps at most this much of it


def refuse(log: logging.Logger, message: str, code: int = 2, termination_log: Path = TERMINATION_LOG) -> int:
    """In a pod, write why the sidecar cannot start as its termination message; log it (the last line, which
    FallbackToLogsOnError falls back to); returns `code`."""
    if termination_log.exists():
        try:
            termination_log.write_bytes(message.encode()[:TERMINATION_BYTES])
        except OSError as e:
            log.warning("could not write the termination message to %s: %s", termination_log, e)
    log.error("%s", message)
    return code


def start_sidecar(log: logging.Logger) -> tuple[PodEnv, RLHFJob] | None:
    """Logging, SIGTERM handling, env and job; None (after `refuse` said why) when the env or job file is bad."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    exit_on_sigterm()
    try:
        env = PodEnv.from_environ()
        return env, env.load_job()
    except (PodEnvError, ValueError) as e:
        refuse(log, str(e))
        return None


def etcd_security(env: PodEnv) -> EtcdSecurity:
    """TLS files and etcd user of the pod env (the job's etcd.tlsSecret and etcd.authSecret)."""
    def text(p: object) -> str | None:
        return None if p is None else str(p)

    return EtcdSecurity(ca_file=text(env.etcd_ca_file), cert_file=text(env.etcd_cert_file),
                        key_file=text(env.etcd_key_file), username=env.etcd_username, password=env.etcd_password)
