"""Local process supervision for `tandem run`: start containers of the built pods as processes.

Role: turn the pod manifests that the operator's builders produce into local processes — the same
commands and environment a cluster would run, with cluster-only values (ConfigMap paths, Secret
refs, pod addresses, /dev/shm volumes) rewritten for one machine. Each container is a session of
its own; `stop_all` returns only when no process of those sessions is left (vLLM's engine core
and workers, grandchildren of the rollout process, included). Caller: `tandem.cli.local`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass
class LocalContainer:
    pod: str
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    cpus: frozenset[int] | None = None  # the cores its processes may run on (None: every core)
    restarts: int = 0  # times it was started again after exiting with an error (`supervise`)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.pod}/{self.name}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close_log()
        cpus = self.cpus
        # set in the child before exec: every thread and process it starts (vLLM's) inherits it
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=pin)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal_group(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def members(self) -> list[int]:
        """Live processes of this container: its session (the leader started one), children and
        grandchildren included, also those orphaned when the leader exited."""
        return [] if self.proc is None else session_members(self.proc.pid)

    def send(self, sig: int) -> None:
        """Signal every live process of the container (the leader's group and any orphan of it).
        On SIGTERM the sidecars shut down what they started in order (the rollout sidecar waits
        for vLLM's processes and unlinks their shared memory)."""
        for pid in self.members():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, grace: float = 10.0) -> None:
        stop_all([self], grace)

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, read from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            out.append(int(entry))
    return out


def wait_gone(containers: list[LocalContainer], timeout: float) -> bool:
    """Wait until no process of `containers` is alive (leaders reaped); False at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        for c in containers:
            if c.proc is not None:
                c.proc.poll()  # reap the leader
        if not any(c.members() for c in containers):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_all(containers: list[LocalContainer], grace: float = 10.0, kill_wait: float = 30.0) -> list[str]:
    """Stop containers and return only when every process they started is gone: SIGTERM all their
    processes, wait up to `grace` seconds for all of them (grandchildren included) to exit, then
    SIGKILL whatever is left and wait for that too. Returns labels of containers that had to be
    killed; raises RuntimeError if processes survive SIGKILL for `kill_wait` seconds."""
    for c in containers:
        c.send(signal.SIGTERM)
    killed = []
    if not wait_gone(containers, grace):
        for c in containers:
            if c.members():
                killed.append(c.label)
                c.send(signal.SIGKILL)
        if not wait_gone(containers, kill_wait):
            left = {c.label: c.members() for c in containers if c.members()}
            raise RuntimeError(f"processes survived SIGKILL: {left}")
    for c in containers:
        if c.proc is not None:
            c.proc.wait()
        c.close_log()
    return killed


def _env_value(item: dict[str, Any], secrets: dict[tuple[str, str], str]) -> str | None:
    """The value a kubelet would give `item`; None where no local value exists (a Secret other than
    the job's own, a ConfigMap: the process keeps what the shell exports, e.g. HF_TOKEN)."""
    if "value" in item:
        return str(item["value"])
    ref = item.get("valueFrom", {})
    if "secretKeyRef" in ref:
        return secrets.get((ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"]))
    if "fieldRef" in ref:
        path = ref["fieldRef"].get("fieldPath", "")
        return "127.0.0.1" if path.endswith("IP") else ""
    return None


Overrides = Callable[[str, str], dict[str, str]]


def containers_of(pod: dict[str, Any], *, overrides: Overrides, secrets: dict[tuple[str, str], str],
                  logs: Path) -> list[LocalContainer]:
    """The pod's containers (native sidecars first) as local processes.

    `overrides(pod_name, container_name)` returns env values that replace the manifest's.
    """
    name = pod["metadata"]["name"]
    spec = pod["spec"]
    sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    out = []
    for c in sidecars + list(spec.get("containers", [])):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
        for item in c.get("env", []):
            value = _env_value(item, secrets)
            if value is not None:
                env[item["name"]] = value
        env.update(overrides(name, c["name"]))
        argv = list(c.get("command", [])) + list(c.get("args", []))
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        out.append(LocalContainer(name, c["name"], argv, env, logs / f"{name}-{c['name']}.log"))
    return out


def pod_cpus(pods: list[str], cores: list[int]) -> dict[str, frozenset[int]]:
    """Each pod's own share of `cores`, as pods on separate nodes or GPUs have: contiguous, as even as
    possible; with more pods than cores, pods share cores round-robin."""
    if not cores:
        raise ValueError("no cores to share")
    if len(pods) > len(cores):
        return {pod: frozenset({cores[i % len(cores)]}) for i, pod in enumerate(pods)}
    return {pod: frozenset(cores[i * len(cores) // len(pods):(i + 1) * len(cores) // len(pods)])
            for i, pod in enumerate(pods)}
