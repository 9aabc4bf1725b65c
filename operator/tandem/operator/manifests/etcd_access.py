"""How a job's pods reach its etcd: the TLS files and etcd user of `spec.checkpointEngine.etcd`.

Callers: `tandem.operator.manifests.builders` (every container's env, the pod's `job-spec` volume). Pure.

  tlsSecret   Secret with ca.crt, tls.crt, tls.key: projected beside job.yaml into the pod's
              `job-spec` volume (at /etc/tandem/etcd/, read-only; one volume, so no mount nests in
              another), and TANDEM_ETCD_CA_FILE / _CERT_FILE / _KEY_FILE name the files.
  authSecret  Secret with username, password: TANDEM_ETCD_USERNAME / _PASSWORD from secretKeyRef
              (the values never appear in the pod spec).

The sidecars turn these variables into an `EtcdSecurity` (`tandem.checkpoint_engine.etcd.security`,
in `tandem.sidecars.startup`).
"""

from __future__ import annotations

from typing import Any

from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv

Manifest = dict[str, Any]

TLS_DIR = "etcd"  # under the job-spec volume's mount (/etc/tandem)
TLS_FILES = {"ca_file": "ca.crt", "cert_file": "tls.crt", "key_file": "tls.key"}  # PodEnv field → Secret key
AUTH_KEYS = {"username": "username", "password": "password"}  # etcd_<field> → Secret key


def env(job: RLHFJob, mount: str) -> list[Manifest]:
    """Env entries of the job's etcd credentials; `mount`: where the job-spec volume is mounted."""
    etcd = job.spec.checkpoint_engine.etcd
    out: list[Manifest] = []
    if etcd.tls_secret is not None:
        plain = PodEnv.environ(**{f"etcd_{f}": f"{mount}/{TLS_DIR}/{key}" for f, key in TLS_FILES.items()})
        out += [{"name": k, "value": v} for k, v in plain.items()]
    if etcd.auth_secret is not None:
        out += [{"name": PodEnv.var(f"etcd_{f}"),
                 "valueFrom": {"secretKeyRef": {"name": etcd.auth_secret, "key": key}}}
                for f, key in AUTH_KEYS.items()]
    return out


def job_spec_volume(job: RLHFJob, volume: Manifest) -> Manifest:
    """The pod's job-spec volume (a ConfigMap volume), with the tlsSecret's files projected beside
    job.yaml when the job names one; unchanged otherwise."""
    secret = job.spec.checkpoint_engine.etcd.tls_secret
    if secret is None:
        return volume
    items = [{"key": key, "path": f"{TLS_DIR}/{key}"} for key in TLS_FILES.values()]
    return {"name": volume["name"], "projected": {"sources": [
        {"configMap": volume["configMap"]},
        {"secret": {"name": secret, "items": items}},
    ]}}
