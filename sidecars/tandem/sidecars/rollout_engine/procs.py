"""vLLM's processes and their shared-memory segments: recorded at start, reaped and unlinked at the end.

Caller: engine.py (`EngineProcesses.record` after vLLM started, `reap` when the engine is
terminated or found dead, `kill` when it hangs).

Why: vLLM's engine core and workers are child processes of the rollout process that talk through
segments in /dev/shm: `psm_*` (Python `SharedMemory` ring buffers of vLLM's message queues,
160-250 MB nominal each) and, with tensor parallelism on CPU, `vllm_dist_*-cpushm_*` (its C++
all-reduce buffers). A segment is unlinked by the process that created it when that process exits
in order. vLLM's shutdown SIGTERMs the engine core, which then exits without unlinking its queue,
and a killed engine unlinks nothing; Python's resource tracker would unlink leftovers only when
the rollout process itself exits, so a pod that restarts vLLM every iteration fills its /dev/shm.

So after start the engine's processes (the children that appeared during start, and their
children) and the top-level /dev/shm files they map are recorded; `reap` waits until those
processes are gone (SIGKILL after a grace period), then unlinks the recorded segments that are
still there and that no live process maps.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path

import psutil

log = logging.getLogger(__name__)
SHM = Path("/dev/shm")


def shm_segments(pid: int) -> set[str]:
    """Names of the top-level /dev/shm files that process `pid` maps (semaphores left out: the
    multiprocessing machinery owns those, and they are unlinked at once)."""
    out: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                path = parts[5].rstrip("\n")
                if path.endswith(" (deleted)") or not path.startswith("/dev/shm/"):
                    continue
                name = path[len("/dev/shm/") :]
                if "/" not in name and not name.startswith("sem."):
                    out.add(name)
    except OSError:  # gone meanwhile, or not ours to read
        pass
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _tracker(p: psutil.Process) -> bool:
    """Python's resource tracker (started by this process on vLLM's first use of multiprocessing):
    this process's, not the engine's; it exits with this process."""
    try:
        return any("resource_tracker" in part for part in p.cmdline())
    except psutil.Error:
        return True


def descendants() -> list[psutil.Process]:
    try:
        return list(psutil.Process().children(recursive=True))
    except psutil.Error:
        return []


def _unregister(name: str) -> None:
    """Tell Python's resource tracker the segment is gone, so it does not try again at exit."""
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        resource_tracker.unregister(f"/{name}", "shared_memory")


class EngineProcesses:
    """The processes of one vLLM engine and the shm segments they map."""

    def __init__(self, before: Iterable[psutil.Process] = ()) -> None:
        self._before = {p.pid for p in before}
        self.procs: dict[int, psutil.Process] = {}
        self.segments: set[str] = set()

    @classmethod
    def before_start(cls) -> EngineProcesses:
        """Snapshot this process's children before vLLM starts; what appears later is vLLM's."""
        return cls(descendants())

    def record(self) -> None:
        """After start: record the children that appeared since `before_start` (vLLM's engine core;
        Python's resource tracker left out), then `refresh`."""
        for p in descendants():
            if p.pid not in self._before and p.pid not in self.procs and not _tracker(p):
                self.procs[p.pid] = p
        self.refresh()

    def refresh(self) -> None:
        """Add the recorded processes' own children (workers) and the segments they all map; only
        adds, and never looks at other children of this process (other engines, etcd in tests)."""
        for p in list(self.procs.values()):
            try:
                kids = p.children(recursive=True) if _alive(p) else []
            except psutil.Error:
                kids = []
            for k in kids:
                self.procs.setdefault(k.pid, k)
        for p in list(self.procs.values()):
            if _alive(p):
                self.segments |= shm_segments(p.pid)

    def alive(self) -> list[psutil.Process]:
        return [p for p in self.procs.values() if _alive(p)]

    def kill(self) -> list[int]:
        """SIGKILL every recorded process still alive (a hung engine), its workers included; their pids."""
        self.refresh()
        alive = self.alive()
        for p in alive:
            try:
                p.kill()
            except Exception as e:  # noqa: BLE001 - gone meanwhile
                log.debug("kill %d: %s", p.pid, e)
        return [p.pid for p in alive]

    def any_dead(self) -> bool:
        """True when one of vLLM's processes died (the engine cannot serve any more)."""
        return bool(self.procs) and len(self.alive()) < len(self.procs)

    def reap(self, grace_s: float = 5.0) -> list[str]:
        """Wait until every recorded process is gone (SIGKILL after `grace_s`), then unlink the
        recorded segments nobody maps any more; returns the names unlinked."""
        left = self.alive()
        if left:
            _, left = psutil.wait_procs(left, timeout=grace_s)
            left = [p for p in left if _alive(p)]
            for p in left:
                with contextlib.suppress(psutil.Error):
                    log.warning("vLLM process %d still alive %.0fs after shutdown: killing it", p.pid, grace_s)
                    p.kill()
            _, left = psutil.wait_procs(left, timeout=grace_s)
            # a worker orphaned by its killed engine core is reparented, and stays a zombie until its new
            # parent reaps it: psutil still finds its pid, but it is gone and maps nothing
            left = [p for p in left if _alive(p)]
            if left:
                log.error("vLLM processes %s survived SIGKILL", [p.pid for p in left])
        mapped: set[str] = set()
        for p in left:
            mapped |= shm_segments(p.pid)
        removed = []
        for name in sorted(self.segments - mapped):
            try:
                (SHM / name).unlink()
            except FileNotFoundError:
                continue  # unlinked by its creator
            except OSError as e:
                log.warning("could not remove /dev/shm/%s: %s", name, e)
                continue
            _unregister(name)
            removed.append(name)
        self.procs.clear()
        self.segments.clear()
        return removed
