"""`tandem run`'s sandbox servers (codeExec, the python tool): the pods' `sandbox` containers as local processes.

Role: `tandem.cli.local.processes_for` hands it the containers of the built pods; for each pod with a
`sandbox` container (`tandem.operator.manifests.sandbox_pod`) it gives the server and that pod's trainer one
socket under the run directory instead of the pod's emptyDir, and gives the server an environment
of its own instead of the trainer's (no token, no TANDEM_* but the socket, none of the shell's
secrets such as HF_TOKEN).

Isolation here: run as root, the server drops to uid 10002 at start
(`tandem.sidecars.sandbox.sandbox_server.prepare`), so its programs cannot read the trainer's files or /proc
entries, nor signal it, as in a pod; run as another user, the server and its programs share that user, and only the
per-program confinement (rlimits, seccomp, Landlock where the kernel has it) stands between them and that user's
files: the caller prints a warning.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from tandem.cli.local_procs import LocalContainer
from tandem.operator.manifests import sandbox_pod
from tandem.spec.podenv import PodEnv

SOCKET_PATH_MAX = 100  # bytes; sun_path holds 108
KEPT_ENV = ("PATH", "LANG", "PYTHONPATH")


def socket_path(run_dir: Path, pod: str) -> Path:
    """`<run_dir>/sandbox/<pod>.sock`; where that is too long for a socket address, the same name in a
    directory under /tmp named by the run directory (so that every run of it reuses that directory)."""
    path = run_dir / "sandbox" / f"{pod}.sock"
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(run_dir.resolve())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"tandem-sandbox-{digest}" / f"{pod}.sock"


def rewire(containers: list[LocalContainer], run_dir: Path) -> list[LocalContainer]:
    """`containers` with each sandbox server and its pod's trainer and rollout sharing a local socket (in place);
    only the containers the pod builder gave the socket (`sandbox_pod.attach`) get it here."""
    var = PodEnv.var("sandbox_socket")
    sockets = {c.pod: socket_path(run_dir, c.pod) for c in containers if c.name == sandbox_pod.CONTAINER}
    for c in containers:
        if c.pod not in sockets or (c.name != sandbox_pod.CONTAINER and var not in c.env):
            continue
        if c.name == sandbox_pod.CONTAINER:
            c.env = {k: v for k, v in c.env.items() if k in KEPT_ENV}
        c.env[var] = str(sockets[c.pod])
    return containers


def isolation_note(containers: list[LocalContainer]) -> str | None:
    """A warning for the console when sandboxed programs will share this user, else None."""
    if os.geteuid() == 0 or not any(c.name == sandbox_pod.CONTAINER for c in containers):
        return None
    return (f"codeExec programs run as your user (uid {os.getuid()}): confined by rlimits, seccomp and Landlock "
            "where the kernel has it, but weaker than in a cluster or under root, where they get a uid of their own")
