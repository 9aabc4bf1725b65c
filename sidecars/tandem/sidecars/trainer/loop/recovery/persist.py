"""Durable copies of the driver's published weights, made in the background while the loop goes on.

Role: with `checkpointEngine.persist` set, every `every`-th iteration's version (and the last
iteration's: `due`) is copied from shared memory to the durable store (`checkpoint_engine.versions.durable`),
so a gang restart (new pods, empty /dev/shm) can resume from it (`resume.resume_point` takes the newest of
shm, this store and the kept rollout-only pods). The weights only: each rank's optimizer and critic state
beside the copy is `train_state`'s, written by the same due Publish phase. The copy runs in one worker thread
while the next rollout proceeds; the version is pinned in etcd for the copy's duration so the publisher's GC
cannot delete it under the reader. A copy still running when the next one is due is waited for
(backpressure); the iteration's row gets `persist_wait_s`, and the last finished copy's `persisted_version`
and `persist_s`. A failed copy is logged and counted (`failures`), never fatal to training.
Callers: `..phases.publish.persist` (driver rank only: `after_publish` per due iteration), `..start.create`
(builds it), `TrainerContext.close` (`close`: the last copy finished).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.versions import layout
from tandem.checkpoint_engine.versions.durable import DurableStore, DurableVersion

log = logging.getLogger(__name__)


def due(completed: int, every: int, iterations: int) -> bool:
    """A copy is due after `completed` iterations: every `every`-th, and the last one."""
    return completed % every == 0 or completed == iterations


class Persister:
    def __init__(self, store: DurableStore, registry: SyncRegistry, shm_dir: Path, job: str, *, every: int,
                 iterations: int) -> None:
        self.store, self.registry, self.shm_dir, self.job = store, registry, Path(shm_dir), job
        self.every, self.iterations = every, iterations
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="persist")
        self._pending: Future[DurableVersion] | None = None
        self.last: DurableVersion | None = None
        self.last_seconds: float | None = None
        self.failures = 0

    def due(self, completed: int) -> bool:
        return due(completed, self.every, self.iterations)

    def after_publish(self, iteration: int, version: int) -> dict[str, Any]:
        """Start copying `version` (published by `iteration`) if due; returns metrics for the row."""
        completed = iteration + 1
        if not self.due(completed):
            return {}
        t = time.perf_counter()
        self._collect()
        waited = time.perf_counter() - t
        self.registry.pin(version)
        source = layout.version_dir(self.shm_dir, self.job, version)
        self._pending = self._pool.submit(self._copy, source, version, completed)
        out: dict[str, Any] = {"persist_wait_s": waited}
        if self.last is not None:
            out |= {"persisted_version": self.last.version, "persist_s": self.last_seconds}
        return out

    def _copy(self, source: Path, version: int, completed: int) -> DurableVersion:
        t = time.perf_counter()
        try:
            saved = self.store.save(source, version, completed)
        finally:
            try:
                self.registry.unpin(version)
            except errors.RegistryUnavailable as e:  # the pin is lease-bound: it goes with the lease
                log.warning("unpin of version %d failed: %s", version, e)
        self.last_seconds = time.perf_counter() - t
        log.info("version %d (after %d iterations) copied to %s in %.2fs", version, completed, saved.path,
                 self.last_seconds)
        return saved

    def _collect(self) -> None:
        """Wait for the copy in flight; a failed copy is logged and counted, not fatal to training."""
        if self._pending is None:
            return
        try:
            self.last = self._pending.result()
        except Exception as e:  # noqa: BLE001 - disk full, volume gone: the job goes on, the note says so
            self.failures += 1
            log.error("durable copy failed (%d so far): %s", self.failures, e)
        self._pending = None

    def close(self) -> None:
        """Finish the copy in flight (the last iteration's version must be durable), then stop."""
        self._collect()
        self._pool.shutdown(wait=True)
