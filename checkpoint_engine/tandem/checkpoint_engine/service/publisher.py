"""Publisher: trainer-side checkpoint engine — named HF tensors → shared-memory version → etcd.

Caller: the trainer sidecar, with `export_hf(target_tp, target_rank)` of the Megatron engine as
`named_tensors`; tests and bench/weight_sync.py with a transformers state_dict.

publish(v, tensors) = write the layout into a temp dir, rename it into place (layout.py), then
register it in one etcd transaction on the publisher's lease (`..etcd.version_registry`), then garbage-collect
versions beyond the newest `keep` that no reader pins (etcd records first, then files). A
publisher killed at any point leaves either nothing visible or a complete version; its temp
dir is removed by the next publisher's `recover()` (or the next GC).

Recycled slots (`recycle=True`, the default): the GC does not delete a collected version's
shard files but keeps them as spares (slots.py, at most one version's bytes), and the next
publish writes its shards into them, so from the third version on a publish writes into
/dev/shm pages that already exist instead of faulting fresh ones (bench/weight_sync.py:
first vs steady-state publishes). Shared memory then holds `keep` versions plus one spare slot
between publishes, which is what it held at the peak of every publish anyway. Only versions the
registry's GC released (no reader pin; none can be taken after) are recycled, and not those another
pod is still pulling (a `receiving` key): their files are deleted, so open fds keep the old bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.engine_status import EngineStatus, Phase, PublishReport
from tandem.checkpoint_engine.versions import layout, slots, version_writer

log = logging.getLogger(__name__)


class Publisher:
    def __init__(
        self,
        shm_root: Path,
        job: str,
        registry: SyncRegistry,
        keep: int = 2,
        shard_bytes: int = layout.DEFAULT_SHARD_BYTES,
        fsync: bool = False,
        role: str = "trainer",
        recycle: bool = True,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1 (the latest version)")
        self.shm_root, self.job, self.registry = Path(shm_root), job, registry
        self.keep, self.shard_bytes, self.fsync, self.role = keep, shard_bytes, fsync, role
        self.recycle = recycle
        self.spares = slots.spare_dir(layout.job_dir(self.shm_root, job))
        self.phase = Phase.IDLE
        self.version: int | None = None
        self.error: str | None = None
        self.timings: dict[str, float] = {}
        self._lock = threading.Lock()

    def recover(self) -> dict[str, Any]:
        """Start-up cleanup: stale temp dirs of dead writers, and local versions etcd no longer lists."""
        stale = layout.clean_stale_temps(self.shm_root, self.job)
        registered = set(self.registry.versions())
        orphans = [v for v in layout.list_versions(self.shm_root, self.job) if v not in registered]
        for v in orphans:
            layout.remove_version(self.shm_root, self.job, v)
        latest = self.registry.latest()
        if latest is not None and (self.version is None or latest > self.version):
            self.version = latest
        return {"stale_temps": stale, "orphan_versions": orphans, "latest": latest}

    def next_version(self) -> int:
        """One above the newest version anyone knows of: the registry's, what this publisher wrote, what is in
        its shared memory. Never the registry's alone: a lease that expired (etcd unreachable past its TTL, a
        starved keepalive) takes the records with it while the versions stay in shm, and counting from the
        registry again would collide with them (VersionExists)."""
        return self._next_after(self.registry.latest())

    def _next_after(self, latest: int | None) -> int:
        known = [v for v in (latest, self.version, *layout.list_versions(self.shm_root, self.job)) if v is not None]
        return max(known, default=0) + 1

    def publish(self, version: int | None, named_tensors: Iterable[tuple[str, torch.Tensor]],
                adapter: dict[str, Any] | None = None) -> PublishReport:
        """Write, register and GC one version; `version=None` takes latest + 1. `adapter`: the PEFT config of
        a version holding LoRA adapters only (adapters.py)."""
        with self._lock:
            t0 = time.perf_counter()
            latest = self.registry.latest()  # one read: the next version's base and the check below
            v = self._next_after(latest) if version is None else version
            if latest is not None and v <= latest:
                raise errors.VersionExists(f"version {v} is not newer than the registered latest {latest}")
            self._set(Phase.PUBLISHING)
            try:
                wrote = version_writer.write_version(
                    self.shm_root, self.job, v, named_tensors, shard_bytes=self.shard_bytes, fsync=self.fsync,
                    spares=self.spares if self.recycle else None, expected_shards=self._shard_sizes(),
                    adapter=adapter,
                )
            except Exception as e:
                self._set(Phase.IDLE, error=f"write of version {v} failed: {e}")
                raise
            t1 = time.perf_counter()
            try:
                self.registry.register(wrote.index, str(wrote.path))
            except Exception as e:
                # never registered: nobody can be reading it, so its files can go
                layout.remove_version(self.shm_root, self.job, v)
                self._set(Phase.IDLE, error=f"register of version {v} failed: {e}")
                raise
            t2 = time.perf_counter()
            self.version = v
            collected = self.gc()
            t3 = time.perf_counter()
            report = PublishReport(
                version=v,
                bytes=wrote.bytes,
                tensors=len(wrote.index.tensors),
                shards=len(wrote.index.shards),
                path=str(wrote.path),
                write_s=t1 - t0,
                register_s=t2 - t1,
                gc_s=t3 - t2,
                total_s=t3 - t0,
                collected=collected,
                recycled_bytes=wrote.recycled,
            )
            self.timings.update(
                {
                    "write_s": report.write_s,
                    "register_s": report.register_s,
                    "gc_s": report.gc_s,
                    "publish_total_s": report.total_s,
                }
            )
            self._set(Phase.IDLE)
            return report

    def gc(self) -> list[int]:
        """Unregister and delete versions beyond the newest `keep` that no reader pins."""
        try:
            collected = self.registry.gc(self.keep)
        except errors.RegistryUnavailable as e:
            log.warning("gc skipped: %s", e)
            return []
        for v in collected:
            if self.recycle and not self._being_received(v):
                slots.retire(layout.version_dir(self.shm_root, self.job, v), self.spares)
            else:  # deleted files keep serving the fds this pod's holder server has open on them
                layout.remove_version(self.shm_root, self.job, v)
        if self.recycle and collected:
            sizes = self._shard_sizes()
            slots.trim(self.spares, sum(sizes) if sizes else 0)  # one slot: what the next publish needs
        layout.clean_stale_temps(self.shm_root, self.job)
        return collected

    def _being_received(self, v: int) -> bool:
        """Whether another pod is still pulling version v (it does not pin it: its pull is verified
        shard by shard); its shard files must then not be overwritten."""
        try:
            prefix = keys.receiving_prefix(self.registry.namespace, self.registry.scope, v)
            return bool(self.registry.list_ordered(prefix))
        except errors.RegistryUnavailable:
            return True  # unknown: do not recycle

    def _shard_sizes(self) -> list[int] | None:
        """Shard sizes of the newest local version: the next version's, when its tensors are the same."""
        local = layout.list_versions(self.shm_root, self.job)
        if not local:
            return None
        try:
            return [s.nbytes for s in layout.read_index(layout.version_dir(self.shm_root, self.job, local[-1])).shards]
        except errors.TornVersion:
            return None

    def status(self) -> EngineStatus:
        return EngineStatus(
            role=self.role,
            phase=self.phase,
            version=self.version,
            error=self.error,
            timings=dict(self.timings),
            updated=time.time(),
        )

    def _set(self, phase: Phase, error: str | None = None) -> None:
        self.phase, self.error = phase, error
        try:
            self.registry.put_status(self.status().model_dump(mode="json"))
        except errors.RegistryUnavailable as e:
            log.warning("could not publish status: %s", e)

    def close(self, revoke: bool = True) -> None:
        """Stop the lease keepalive; with revoke=True the versions disappear from etcd at once."""
        self.registry.close(revoke=revoke)
