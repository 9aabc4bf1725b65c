"""The operator's view of etcd: read a job's progress record, delete a job's keys.

Callers: `tandem.operator.runtime.reconcile` (progress → status) and the deletion handler in
`tandem.operator.runtime.handlers` (finalizer). Keys come from `tandem.checkpoint_engine.etcd.keys`; values are
parsed by `tandem.spec.progress.Progress`. One aetcd client per endpoint, reused; endpoints are
tried in order until one answers. Every client dials with the operator's own etcd credentials
(`tandem.checkpoint_engine.etcd.security`: TLS and user from `tandem.operator.runtime.env_settings`), whichever
etcd a job names; its user needs read-write on /tandem/jobs/ (the jobs' users reach their own prefix
only). Keys are those of the job's incarnation (`keys.scope(name, uid)`): deleting a job never
touches the records of a newer job of the same name.
"""

from __future__ import annotations

from collections.abc import Sequence

import aetcd

from tandem.checkpoint_engine.errors import CheckpointEngineError
from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.security import EtcdSecurity
from tandem.spec.progress import Progress


class EtcdUnavailable(RuntimeError):
    """No endpoint of the list answered (or etcd refused the operator's credentials: the message says)."""


class EtcdStore:
    def __init__(self, timeout: float = 5.0, security: EtcdSecurity | None = None):
        self.timeout = timeout
        self.security = security or EtcdSecurity()
        self._clients: dict[str, aetcd.Client] = {}

    async def _call(self, endpoints: Sequence[str], op: str, key: bytes) -> object:
        errors: list[str] = []
        for endpoint in endpoints:
            c = self._clients.get(endpoint)
            if c is None:
                c = self._clients[endpoint] = self.security.client(endpoint, timeout=self.timeout)
            try:
                if op == "get":
                    return await c.get(key)
                return await c.delete_prefix(key)
            except (aetcd.exceptions.ClientError, OSError, TimeoutError) as e:
                refused = self.security.refusal(op, e) if isinstance(e, aetcd.exceptions.ClientError) else None
                reason: CheckpointEngineError | Exception = refused or e
                errors.append(f"{endpoint}: {type(reason).__name__}: {reason}")
                await c.close()
                self._clients.pop(endpoint, None)
        raise EtcdUnavailable("; ".join(errors) or "no etcd endpoints configured")

    async def read_progress(self, endpoints: Sequence[str], namespace: str, name: str, uid: str) -> Progress | None:
        """The job's progress record; None when the driver has not written one yet (or it is unreadable)."""
        got = await self._call(endpoints, "get", keys.progress(namespace, keys.scope(name, uid)).encode())
        if got is None:
            return None
        try:
            return Progress.from_json(got.value)  # type: ignore[attr-defined]
        except ValueError:
            return None

    async def delete_job(self, endpoints: Sequence[str], namespace: str, name: str, uid: str) -> int:
        """Delete every key under the prefix of this incarnation of the job; returns how many were deleted."""
        result = await self._call(endpoints, "delete", keys.job_prefix(namespace, keys.scope(name, uid)).encode())
        return int(getattr(result, "deleted", 0))

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()
