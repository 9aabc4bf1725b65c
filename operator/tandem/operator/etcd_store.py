"""The operator's view of etcd: read a job's progress record, delete a job's keys.

Callers: `tandem.operator.reconcile` (progress → status) and the deletion handler in
`tandem.operator.handlers` (finalizer). Keys come from `tandem.checkpoint_engine.keys`; values are
parsed by `tandem.spec.progress.Progress`. One aetcd client per endpoint list, reused; endpoints
are tried in order until one answers.
"""

from __future__ import annotations

from collections.abc import Sequence

import aetcd

from tandem.checkpoint_engine import keys
from tandem.checkpoint_engine.endpoints import parse_endpoint
from tandem.spec.progress import Progress


class EtcdUnavailable(RuntimeError):
    """No endpoint of the list answered."""


class EtcdStore:
    def __init__(self, timeout: float = 5.0):
        self.timeout = timeout
        self._clients: dict[str, aetcd.Client] = {}

    async def _call(self, endpoints: Sequence[str], op: str, key: bytes) -> object:
        errors: list[str] = []
        for endpoint in endpoints:
            c = self._clients.get(endpoint)
            if c is None:
                host, port = parse_endpoint(endpoint)
                c = self._clients[endpoint] = aetcd.Client(host, port, timeout=int(self.timeout) or 1)
            try:
                if op == "get":
                    return await c.get(key)
                return await c.delete_prefix(key)
            except (aetcd.exceptions.ClientError, OSError, TimeoutError) as e:
                errors.append(f"{endpoint}: {type(e).__name__}: {e}")
                await c.close()
                self._clients.pop(endpoint, None)
        raise EtcdUnavailable("; ".join(errors) or "no etcd endpoints configured")

    async def read_progress(self, endpoints: Sequence[str], namespace: str, name: str) -> Progress | None:
        """The job's progress record; None when the driver has not written one yet (or it is unreadable)."""
        got = await self._call(endpoints, "get", keys.progress(namespace, name).encode())
        if got is None:
            return None
        try:
            return Progress.from_json(got.value)  # type: ignore[attr-defined]
        except ValueError:
            return None

    async def delete_job(self, endpoints: Sequence[str], namespace: str, name: str) -> int:
        """Delete every key under the job's prefix; returns how many were deleted."""
        result = await self._call(endpoints, "delete", keys.job_prefix(namespace, name).encode())
        return int(getattr(result, "deleted", 0))

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()
