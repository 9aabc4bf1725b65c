"""Every member of one etcd cluster behind one asyncio client, with failover (aetcd underneath).

Role: `version_registry.Registry` sends each request through `EtcdCluster.call` / `transaction` / `watch`.
A request goes to the member that answered last; when it fails in a way that says "this member is
gone, unreachable or without a leader" (gRPC UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, a socket
error), it is sent to the next endpoint, round after round with a short backoff, until the call's
failover budget is spent; then `errors.RegistryUnavailable` names what every member said.

Why here and not in the library: aetcd 1.0 dials one host:port, and gRPC's own multi-address
targets (`ipv4:a:p,b:p`) take IP literals only, while cluster members are DNS names (pod IPs
change on restart). So there is one aetcd client per endpoint, each with a gRPC channel that redials
on its own; a single endpoint behind a Kubernetes Service fails over the same way (the retry
dials again and lands on a live member).

Retrying is safe for reads, puts, deletes and lease keepalives (idempotent). A transaction is
applied whole or not at all by etcd, but one that failed on a dying member may still have been
committed by the others: `transaction` returns, beside etcd's verdict, whether an earlier attempt
may have been applied, so the caller can tell "my own first attempt won" from "someone else won"
(`Registry.register` reads the version record's lease back). Watches resume on the next member
from the revision after the last event delivered: nothing is lost or repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.endpoints import EndpointError
from tandem.checkpoint_engine.etcd.security import EtcdSecurity, handshake_hint, invalid_token

log = logging.getLogger(__name__)
T = TypeVar("T")

# errors after which another member may well answer (anything else is the request's own fault)
MEMBER_ERRORS: tuple[type[BaseException], ...] = (
    aetcd.exceptions.ConnectionFailedError,  # UNAVAILABLE: refused, reset, "no leader", "leader changed"
    aetcd.exceptions.ConnectionTimeoutError,  # DEADLINE_EXCEEDED: a hung member, an election in progress
    aetcd.exceptions.InternalError,  # INTERNAL: a stream torn down mid-answer
    aetcd.exceptions.WatchTimeoutError,  # a watch the member did not create in time
    OSError,
    TimeoutError,
)

# short reconnect backoff: a member that restarts must be dialled again within a second, not after
# gRPC's default exponential backoff (up to two minutes)
CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}


class EtcdCluster:
    """aetcd clients for `endpoints` (members of one cluster), used one at a time with failover."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = 5.0,
        failover_s: float | None = None,
        security: EtcdSecurity | None = None,
    ) -> None:
        """`timeout`: seconds one request may take on one member; `failover_s`: how long one call
        keeps trying members before it gives up (default twice `timeout`); `security`: TLS and
        user (`security`; default none: plain text, no auth)."""
        if not endpoints:
            raise EndpointError("no etcd endpoints given")
        self.endpoints = list(endpoints)
        self.security = security or EtcdSecurity()
        self._tls = [self.security.tls_for(e) for e in self.endpoints]  # checks every endpoint now
        self.timeout = timeout
        self.failover_s = 2 * timeout if failover_s is None else failover_s
        self.transactions = aetcd.Transactions()  # compare/op builders: the same for every member
        self._clients: list[aetcd.Client | None] = [None] * len(self.endpoints)
        self._healthy = [False] * len(self.endpoints)
        self._current = 0
        self.failovers = 0  # times the current member changed after a failure

    @property
    def current(self) -> str:
        """The endpoint requests go to now."""
        return self.endpoints[self._current]

    def _client(self, i: int) -> aetcd.Client:
        c = self._clients[i]
        if c is None:
            c = self._clients[i] = self.security.client(self.endpoints[i], timeout=self.timeout,
                                                        options=CHANNEL_OPTIONS)
        return c

    def _refused(self, what: str, e: aetcd.exceptions.ClientError) -> errors.CheckpointEngineError:
        """A request's own failure: an auth refusal (typed), else RegistryUnavailable."""
        return self.security.refusal(what, e) or errors.RegistryUnavailable(
            f"etcd {what} failed: {type(e).__name__}: {e}")

    async def _redial(self, i: int) -> None:
        """Drop member i's client (its auth token expired): the next request dials and authenticates."""
        c, self._clients[i] = self._clients[i], None
        if c is not None:
            with contextlib.suppress(Exception):
                await c.close()

    def _failed(self, i: int, what: str, e: BaseException) -> None:
        """Member i failed a request: later requests go to the next one (once, however many failed)."""
        was_healthy, self._healthy[i] = self._healthy[i], False
        if self._current != i:
            return
        self._current = (i + 1) % len(self.endpoints)
        if len(self.endpoints) > 1:
            self.failovers += 1
        log.log(
            logging.WARNING if was_healthy else logging.DEBUG,
            "etcd %s failed on %s (%s: %s); now using %s",
            what, self.endpoints[i], type(e).__name__, e, self.current,
        )

    async def _call(
        self, what: str, fn: Callable[[aetcd.Client], Awaitable[T]], budget: float | None
    ) -> tuple[T, int, bool]:
        """(result, member index, whether an earlier attempt failed and may have been applied)."""
        deadline = time.monotonic() + (self.failover_s if budget is None else budget)
        failures: list[str] = []
        pause = 0.05
        redialled = False
        while True:
            i = self._current
            try:
                result = await fn(self._client(i))
            except MEMBER_ERRORS as e:
                failures.append(f"{self.endpoints[i]}: {type(e).__name__}: {e}")
                self._failed(i, what, e)
            except aetcd.exceptions.ClientError as e:
                if invalid_token(e) and not redialled:
                    redialled = True
                    await self._redial(i)
                    continue
                raise self._refused(what, e) from e
            else:
                self._healthy[i] = True
                return result, i, bool(failures)
            if time.monotonic() >= deadline:
                last = "; ".join(failures[-len(self.endpoints):])
                raise errors.RegistryUnavailable(f"etcd {what} failed on every endpoint ({last}){handshake_hint(last)}")
            if len(failures) % len(self.endpoints) == 0:  # a whole round failed: back off a little
                await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, 1.0)

    async def call(self, what: str, fn: Callable[[aetcd.Client], Awaitable[T]], budget: float | None = None) -> T:
        """`fn(client)` on the current member, moved to the next on member errors (for idempotent
        requests); `budget` overrides `failover_s` (e.g. to wait for a starting etcd)."""
        return (await self._call(what, fn, budget))[0]

    async def transaction(self, what: str, compare: list[Any], success: list[Any]) -> tuple[bool, bool]:
        """(etcd's verdict, uncertain): `uncertain` when an earlier attempt failed on a member and
        may have been committed anyway, so a False verdict may be the echo of our own success."""
        (ok, _), _, uncertain = await self._call(
            what, lambda c: c.transaction(compare=compare, success=success, failure=[]), None
        )
        return bool(ok), uncertain

    async def revision(self, key: bytes) -> tuple[Any, int]:
        """(the key's KeyValue or None, the store revision of the read) — the revision a watch
        that must miss nothing after this read starts from, plus one."""
        got = await self.call("get", lambda c: c.get_range(key, key + b"\0"))
        kvs = list(got)
        return (kvs[0] if kvs else None), int(got.header.revision)

    async def watch(self, what: str, key: bytes, start_revision: int) -> AsyncIterator[Any]:
        """Events of `key` from `start_revision` on, across member losses (resumed on another
        member from the revision after the last event delivered)."""
        next_rev = start_revision
        while True:
            watch, i, _ = await self._call(what, lambda c: c.watch(key, start_revision=next_rev), None)  # noqa: B023
            try:
                async for ev in watch:
                    next_rev = int(ev.kv.mod_revision) + 1
                    yield ev
                return
            except MEMBER_ERRORS as e:
                self._failed(i, what, e)
            except aetcd.exceptions.ClientError as e:
                if not invalid_token(e):
                    raise self._refused(what, e) from e
                await self._redial(i)  # resumed on a fresh dial from the next revision
            finally:
                with contextlib.suppress(Exception):
                    await watch.cancel()

    async def close(self) -> None:
        for c in self._clients:
            if c is not None:
                with contextlib.suppress(Exception):
                    await c.close()
        self._clients = [None] * len(self.endpoints)
