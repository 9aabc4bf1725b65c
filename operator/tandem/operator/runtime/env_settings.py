"""Operator settings, read once from the environment (the chart's Deployment sets them).

Callers: `tandem.operator.runtime.handlers` (startup, timer interval) and `tandem.operator.__main__`.

  TANDEM_ETCD_ENDPOINTS        comma-separated etcd URLs used when a job names none: the operator
                               reads progress and deletes keys there, and pods get it in their env
                               (default: the chart's etcd, http://tandem-etcd.tandem-system.svc:2379)
  TANDEM_RECONCILE_INTERVAL    seconds between reconciles of one job (default 2)
  TANDEM_ETCD_TIMEOUT          seconds per etcd call (default 5)
  TANDEM_FINALIZER_RETRIES     attempts to delete a job's etcd keys before giving up and letting
                               the RLHFJob go anyway (default 12, 5 s apart)
  TANDEM_MAX_CONNECTIONS       HTTP connections to the API server (default 64)
  TANDEM_METRICS_PORT          port of the Prometheus /metrics endpoint (default 0: not served;
                               the chart sets 8081)
  TANDEM_ETCD_CA_FILE          CA bundle etcd's serving certificate is checked against (https://)
  TANDEM_ETCD_CERT_FILE        client certificate and key the operator presents to etcd
  TANDEM_ETCD_KEY_FILE         (the chart mounts them from etcd.client.tlsSecret)
  TANDEM_JOB_NETWORK_POLICY    true: a NetworkPolicy per job, letting only the job's own pods reach
                               them (`tandem.operator.manifests.netpol_builder`; default false)
  TANDEM_NETWORK_POLICY_EXTRA_FROM  more allowed sources of those policies: a JSON list of
                               NetworkPolicyPeer objects (default [])
  TANDEM_NETWORK_POLICY_SCRAPE_FROM  the Prometheus that scrapes the job pods (the chart's
                               monitoring.scraper): NetworkPolicyPeer objects let in on the metrics
                               ports only (ce-trainer, ce-rollout; default [])
  TANDEM_ETCD_USERNAME         etcd user and password of the operator (the chart: from
  TANDEM_ETCD_PASSWORD         etcd.client.authSecret); it needs read-write on /tandem/jobs/
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tandem.checkpoint_engine.etcd.security import EtcdSecurity, EtcdSecurityError
from tandem.operator.manifests.builders import DEFAULT_ETCD_ENDPOINTS


class ConfigError(ValueError):
    """An operator setting in the environment is malformed."""


def env_float(env: Mapping[str, str], key: str, default: float, low: float) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r}: not a number") from None
    if value < low:
        raise ConfigError(f"{key}={raw!r}: must be >= {low}")
    return value


@dataclass(frozen=True)
class OperatorConfig:
    etcd_endpoints: tuple[str, ...]
    reconcile_interval: float = 2.0
    etcd_timeout: float = 5.0
    finalizer_retries: int = 12
    max_connections: int = 64
    metrics_port: int = 0
    etcd_security: EtcdSecurity = EtcdSecurity()
    job_network_policy: bool = False
    network_policy_extra_from: tuple[dict[str, Any], ...] = ()
    network_policy_scrape_from: tuple[dict[str, Any], ...] = ()

    @property
    def default_etcd(self) -> str:
        return ",".join(self.etcd_endpoints)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        raw = env.get("TANDEM_ETCD_ENDPOINTS", DEFAULT_ETCD_ENDPOINTS)
        endpoints = tuple(e.strip() for e in raw.split(",") if e.strip())
        return cls(
            etcd_endpoints=endpoints or (DEFAULT_ETCD_ENDPOINTS,),
            reconcile_interval=env_float(env, "TANDEM_RECONCILE_INTERVAL", 2.0, 0.1),
            etcd_timeout=env_float(env, "TANDEM_ETCD_TIMEOUT", 5.0, 0.1),
            finalizer_retries=int(env_float(env, "TANDEM_FINALIZER_RETRIES", 12, 0)),
            max_connections=int(env_float(env, "TANDEM_MAX_CONNECTIONS", 64, 1)),
            metrics_port=int(env_float(env, "TANDEM_METRICS_PORT", 0, 0)),
            etcd_security=_security(env),
            job_network_policy=_bool(env, "TANDEM_JOB_NETWORK_POLICY"),
            network_policy_extra_from=_peers(env, "TANDEM_NETWORK_POLICY_EXTRA_FROM"),
            network_policy_scrape_from=_peers(env, "TANDEM_NETWORK_POLICY_SCRAPE_FROM"),
        )


def _bool(env: Mapping[str, str], key: str) -> bool:
    raw = env.get(key, "").strip().lower()
    if raw not in ("", "true", "false", "1", "0"):
        raise ConfigError(f"{key}={raw!r}: not true or false")
    return raw in ("true", "1")


def _peers(env: Mapping[str, str], key: str) -> tuple[dict[str, Any], ...]:
    raw = env.get(key, "").strip()
    if not raw:
        return ()
    try:
        peers = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"{key}: not JSON ({e})") from None
    if not isinstance(peers, list) or not all(isinstance(p, dict) for p in peers):
        raise ConfigError(f"{key}: must be a JSON list of NetworkPolicyPeer objects")
    return tuple(peers)


def _security(env: Mapping[str, str]) -> EtcdSecurity:
    try:
        return EtcdSecurity.from_env(env)
    except EtcdSecurityError as e:
        raise ConfigError(str(e)) from None
