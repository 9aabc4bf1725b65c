"""Blocking facade over `Registry`: its own event loop in a daemon thread.

Callers: publisher.py and the rollout engine (which block in torch/vLLM for seconds) and the
FastAPI routes (through a threadpool). Running the asyncio registry on a private loop keeps the
lease keepalive ticking while the caller's thread is busy loading weights.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.security import EtcdSecurity
from tandem.checkpoint_engine.etcd.version_registry import Registry
from tandem.checkpoint_engine.versions.layout import VersionIndex

T = TypeVar("T")


class SyncRegistry:
    """Same operations as `Registry`, called from ordinary threads."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        namespace: str,
        job: str,
        pod: str,
        role: str,
        ttl: int = 10,
        timeout: float = 5.0,
        failover_s: float | None = None,
        *,
        uid: str = "local",
        security: EtcdSecurity | None = None,
    ) -> None:
        """`endpoints`: every member of the etcd cluster (a list, or comma-separated); `uid`,
        `security` and the rest: see `Registry`."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"etcd-{role}", daemon=True)
        self._thread.start()
        self.timeout = timeout
        self.reg: Registry = self._run(
            self._make(endpoints, namespace, job, pod, role, ttl, timeout, failover_s, uid, security), timeout=10
        )
        self.namespace, self.job, self.pod, self.role = namespace, job, pod, role
        self.uid, self.scope = uid, self.reg.scope
        self.endpoints = self.reg.endpoints

    @property
    def endpoint(self) -> str:
        """The etcd member answering now (after `connect`, one that answered)."""
        return self.reg.endpoint

    @staticmethod
    async def _make(
        endpoints: str | Sequence[str], namespace: str, job: str, pod: str, role: str, ttl: int, timeout: float,
        failover_s: float | None, uid: str, security: EtcdSecurity | None,
    ) -> Registry:
        # the Registry (and its asyncio.Event) must be created on the loop that uses it
        return Registry(endpoints, namespace, job, pod, role, ttl=ttl, timeout=timeout, failover_s=failover_s,
                        uid=uid, security=security)

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._loop.is_closed():
            raise errors.RegistryUnavailable("registry is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            # a call may spend its failover budget and then one more request on the last member
            return fut.result(timeout if timeout is not None else self.reg.etcd.failover_s + self.timeout * 3 + 5)
        except FutureTimeout as e:
            fut.cancel()
            raise errors.RegistryUnavailable("etcd did not answer in time") from e

    def connect(self, wait_s: float = 60.0) -> SyncRegistry:
        """Connect, waiting up to `wait_s` for etcd to answer (see `Registry.connect`)."""
        self._run(self.reg.connect(wait_s), timeout=wait_s + self.timeout * 3 + 5)
        return self

    def register(self, index: VersionIndex, directory: str) -> int:
        return self._run(self.reg.register(index, directory))

    def latest(self) -> int | None:
        return self._run(self.reg.latest())

    def version_record(self, v: int) -> dict[str, Any]:
        return self._run(self.reg.version_record(v))

    def shard_records(self, v: int) -> list[dict[str, Any]]:
        return self._run(self.reg.shard_records(v))

    def versions(self) -> list[int]:
        return self._run(self.reg.versions())

    def pin(self, v: int) -> None:
        self._run(self.reg.pin(v))

    def unpin(self, v: int) -> None:
        self._run(self.reg.unpin(v))

    def readers(self, v: int) -> list[str]:
        return self._run(self.reg.readers(v))

    def gc(self, keep: int) -> list[int]:
        return self._run(self.reg.gc(keep))

    def put_status(self, status: dict[str, Any]) -> None:
        self._run(self.reg.put_status(status))

    def get_status(self, pod: str, role: str) -> dict[str, Any] | None:
        return self._run(self.reg.get_status(pod, role))

    def put_op(self, op_id: str, record: dict[str, Any]) -> None:
        self._run(self.reg.put_op(op_id, record))

    def ops(self) -> list[dict[str, Any]]:
        return self._run(self.reg.ops())

    def get_op(self, op_id: str) -> dict[str, Any] | None:
        return self._run(self.reg.get_op(op_id))

    def wait_lease_lost(self, timeout: float) -> bool:
        """True once this identity's lease is lost (expired, or not refreshed for its TTL), within `timeout` s."""
        async def wait() -> bool:
            try:
                await asyncio.wait_for(self.reg.lease_lost.wait(), timeout)
                return True
            except TimeoutError:
                return False

        return self._run(wait(), timeout + 5)

    def put_json(self, key: str, value: dict[str, Any], lease: bool = False) -> None:
        self._run(self.reg.put_json(key, value, lease))

    def get_json(self, key: str) -> dict[str, Any] | None:
        return self._run(self.reg.get_json(key))

    def list_json(self, prefix: str) -> dict[str, dict[str, Any]]:
        return self._run(self.reg.list_json(prefix))

    def add_holder(self, v: int, directory: str) -> None:
        self._run(self.reg.add_holder(v, directory))

    def holders(self, v: int) -> list[str]:
        return self._run(self.reg.holders(v))

    def list_ordered(self, prefix: str) -> list[tuple[str, int, dict[str, Any]]]:
        return self._run(self.reg.list_ordered(prefix))

    def delete(self, key: str) -> None:
        self._run(self.reg.delete(key))

    def wait_latest(self, newer_than: int | None, timeout: float) -> int | None:
        """Block until `latest` exceeds `newer_than` (or exists); None on timeout."""

        async def wait() -> int | None:
            async for v in self.reg.watch_latest():
                if newer_than is None or v > newer_than:
                    return v
            return None

        try:
            return self._run(asyncio.wait_for(wait(), timeout), timeout=timeout + 5)
        except (TimeoutError, errors.RegistryUnavailable):
            return None

    def close(self, revoke: bool = True) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self.reg.close(revoke=revoke), timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()
