"""How weights move: `spec.checkpointEngine` (CheckpointEngine: shared memory, transport, shard size and ports,
the etcd the registry uses, durable copies) — the spec of the `tandem.checkpoint_engine` package.

Role: part of the job's shape, split from models.py. Callers: models.py (JobSpec), the operator's builders
(ports, volumes, etcd), the sidecars through JobSpec.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tandem.spec.strict_model import ABS_PATH, DNS_SUBDOMAIN, ENDPOINT, Base, Quantity, Rule


class Etcd(Base):
    endpoints: Annotated[list[Annotated[str, Field(pattern=ENDPOINT)]], Field(max_length=16)] = Field(
        default_factory=list, description="Empty: the chart's etcd (tandem-etcd in the operator's namespace). "
        "https:// dials TLS; with tlsSecret, an endpoint without a scheme does too.")
    tls_secret: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Secret in the "
                          "job's namespace with ca.crt (etcd's CA), tls.crt and tls.key (a client certificate etcd "
                          "trusts); the sidecars read them at /etc/tandem/etcd/.")] = None
    auth_secret: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Secret in the "
                           "job's namespace with username and password of the job's etcd user (it needs read-write "
                           "on /tandem/jobs/<namespace>/<job>/ only).")] = None
    rules = (
        Rule("!has(self.tlsSecret) || self.endpoints.all(e, !e.startsWith('http://'))",
             "with tlsSecret every endpoint must be https:// or name no scheme", ".endpoints",
             lambda e: e.tls_secret is None or not any(x.startswith("http://") for x in e.endpoints)),
    )


RENDEZVOUS_PORT = 29500  # torch.distributed's MASTER_PORT in every pod (tandem.operator.manifests.builders)


class Persist(Base):
    path: Annotated[str, Field(pattern=ABS_PATH, max_length=1024, description="Directory on a writable volume "
                               "(volumes[].mountPath) that keeps durable copies of published versions.")]
    every: Annotated[int, Field(ge=1, le=1_000_000, description="Iterations between durable copies; the last "
                                "iteration is always copied.")] = 10
    keep: Annotated[int, Field(ge=1, le=100, description="Durable copies kept (newest first).")] = 2


class CheckpointEngine(Base):
    shm_size: Quantity = "64Gi"
    transport: Literal["auto", "rdma", "tcp"] = "auto"
    shard_size_mi_b: Annotated[int, Field(ge=1, le=65_536, alias="shardSizeMiB")] = 512
    port: Annotated[int, Field(ge=1024, le=65_534, description="The trainer's checkpoint-engine API port; the "
                               "rollout's is port + 1 (so at most 65534).")] = 8700
    shard_port: Annotated[int, Field(ge=1024, le=65_535, description="Port of each pod's shard server, which "
                                     "serves published weights to the job's other pods (only to those proving the "
                                     "job's token); fixed so a NetworkPolicy can name it. Pods run as non-root: "
                                     "1024 and up.")] = 8702
    etcd: Etcd = Field(default_factory=Etcd)
    persist: Persist | None = Field(default=None, description="Durable copies of published versions: a gang "
                                    "restart (which loses the pods' shared memory) resumes from the newest.")
    rules = (
        Rule("self.shardPort != self.port && self.shardPort != self.port + 1 && self.shardPort != 29500",
             "must differ from port and port + 1 (the checkpoint-engine APIs) and 29500 (rendezvous)", ".shardPort",
             lambda c: c.shard_port not in (c.port, c.port + 1, RENDEZVOUS_PORT)),
        Rule("self.port != 29500 && self.port + 1 != 29500", "port and port + 1 must not be 29500 (rendezvous)",
             ".port", lambda c: RENDEZVOUS_PORT not in (c.port, c.port + 1)),
    )
