"""Leader election over a coordination.k8s.io/v1 Lease, so that two or more operator replicas run
with exactly one reconciling.

Caller: `tandem.operator.__main__` with `--leader-elect` (the chart passes it): the replica waits in
`LeaderElector.acquire` (serving its liveness endpoint as a standby), then runs kopf while `hold`
renews the Lease every retry period. `hold` returns when the Lease could not be renewed for
`renew_deadline` seconds or another replica took it; the process then exits at once, as client-go's
controllers do, so no write of a former leader can race the new one (its Deployment restarts it as
a standby). A clean stop (SIGTERM) releases the Lease so that a standby takes over without waiting
for it to expire. The decisions are `tandem.operator.policies.lease_policy`'s.

Why not kopf's own peering: two kopf operators of the same priority both freeze (kopf's docs,
"Peering"), so peering gives one active replica only with distinct priorities per replica, which a
Deployment cannot assign; and it needs a cluster-wide peering CRD. A Lease needs one namespaced
object and get/create/update on it.

Settings (environment; the chart sets them):
  TANDEM_LEADER_LEASE            Lease name (default tandem-operator-leader)
  TANDEM_LEADER_NAMESPACE        its namespace (default POD_NAMESPACE, else the service account's)
  TANDEM_LEADER_IDENTITY         this replica's identity (default POD_NAME, else hostname; a random
                                 suffix keeps two processes on one host apart)
  TANDEM_LEASE_DURATION          seconds a standby waits after the last renewal it saw (default 15)
  TANDEM_RENEW_DEADLINE          seconds the leader keeps trying to renew before giving up (default 10)
  TANDEM_RETRY_PERIOD            seconds between tries (default 2)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tandem.operator.policies import lease_policy
from tandem.operator.policies.lease_policy import Action, Observed, Record
from tandem.operator.runtime.env_settings import ConfigError, env_float

log = logging.getLogger(__name__)
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class ElectionConfig:
    namespace: str
    name: str = "tandem-operator-leader"
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ElectionConfig:
        env = os.environ if env is None else env
        namespace = env.get("TANDEM_LEADER_NAMESPACE") or env.get("POD_NAMESPACE") or ""
        if not namespace and SA_NAMESPACE.exists():
            namespace = SA_NAMESPACE.read_text().strip()
        if not namespace:
            raise ConfigError("TANDEM_LEADER_NAMESPACE: not set (nor POD_NAMESPACE): the Lease's namespace")
        base = env.get("TANDEM_LEADER_IDENTITY") or env.get("POD_NAME") or socket.gethostname()
        config = cls(
            namespace=namespace,
            name=env.get("TANDEM_LEADER_LEASE") or cls.name,
            identity=f"{base}_{uuid.uuid4().hex[:8]}",
            lease_duration=env_float(env, "TANDEM_LEASE_DURATION", 15.0, 1.0),
            renew_deadline=env_float(env, "TANDEM_RENEW_DEADLINE", 10.0, 0.5),
            retry_period=env_float(env, "TANDEM_RETRY_PERIOD", 2.0, 0.1),
        )
        if not config.retry_period < config.renew_deadline < config.lease_duration:
            raise ConfigError("TANDEM_RETRY_PERIOD < TANDEM_RENEW_DEADLINE < TANDEM_LEASE_DURATION must hold "
                              f"(got {config.retry_period}, {config.renew_deadline}, {config.lease_duration})")
        return config


class LeaderElector:
    """One replica's side of the election, against one ApiClient."""

    def __init__(self, api: client.ApiClient, config: ElectionConfig):
        self.config = config
        self.leases: Any = client.CoordinationV1Api(api)
        self.observed = Observed()

    async def _read(self) -> Record | None:
        try:
            resp = await self.leases.read_namespaced_lease(self.config.name, self.config.namespace,
                                                          _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return Record.of(json.loads(await resp.read()))

    async def _write(self, action: Action, spec: dict[str, Any]) -> Record | None:
        """Create, or replace conditionally on the resourceVersion read; None when another replica wrote first."""
        c = self.config
        body: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                "metadata": {"name": c.name, "namespace": c.namespace}, "spec": spec}
        try:
            if action is Action.CREATE:
                resp = await self.leases.create_namespaced_lease(c.namespace, body, _preload_content=False)
            else:
                read = self.observed.record
                body["metadata"]["resourceVersion"] = read.resource_version if read else ""
                resp = await self.leases.replace_namespaced_lease(c.name, c.namespace, body,
                                                                  _preload_content=False)
        except ApiException as e:
            if e.status == 409:
                return None
            raise
        return Record.of(json.loads(await resp.read()))

    async def try_once(self) -> bool:
        """Read the Lease and create, renew or take it when the policy says so; True when this replica
        holds it afterwards."""
        self.observed.see(await self._read(), time.monotonic())
        action = lease_policy.decide(self.observed, self.config.identity, time.monotonic())
        if action is Action.WAIT:
            return False
        duration = max(1, round(self.config.lease_duration))
        spec = lease_policy.lease_spec(action, self.observed.record, self.config.identity, duration,
                                       datetime.now(UTC))
        written = await self._write(action, spec)
        if written is None:
            return False
        self.observed.see(written, time.monotonic())
        if action is not Action.RENEW:
            log.info(f"leader election: {self.config.identity} is the leader "
                     f"(lease {self.config.namespace}/{self.config.name}, {action.value})")
        return True

    def holder(self) -> str:
        return self.observed.record.holder if self.observed.record else ""

    async def acquire(self) -> None:
        """Return once this replica holds the Lease."""
        announced = ""
        while True:
            try:
                if await self.try_once():
                    return
            except (TimeoutError, ApiException, OSError) as e:
                log.warning(f"leader election: reading lease {self.config.name} failed: {e}")
            if self.holder() and self.holder() != announced:
                announced = self.holder()
                log.info(f"leader election: standby; {announced} leads")
            await asyncio.sleep(self.config.retry_period)

    async def hold(self) -> str:
        """Renew until leadership is lost; returns why."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.config.retry_period)
            try:
                if await self.try_once():
                    renewed = time.monotonic()
                    continue
            except (TimeoutError, ApiException, OSError) as e:
                log.warning(f"leader election: renewing failed: {e}")
            holder = self.holder()
            if holder and holder != self.config.identity:
                return f"lease taken by {holder}"
            if time.monotonic() - renewed > self.config.renew_deadline:
                return f"lease not renewed for {self.config.renew_deadline:g}s"

    async def release(self) -> None:
        """Give the Lease up (a clean stop): standbys take it at their next try."""
        record = self.observed.record
        if record is None or record.holder != self.config.identity:
            return
        try:
            await self._write(Action.TAKE, lease_policy.released(record, datetime.now(UTC)))
            log.info(f"leader election: {self.config.identity} released the lease")
        except (TimeoutError, ApiException, OSError) as e:
            log.warning(f"leader election: releasing the lease failed (it expires by itself): {e}")
