"""The per-job NetworkPolicy: a job's pods accept traffic only from pods of the same job.

Caller: `tandem.operator.runtime.reconcile.carry_out`, with the job's other objects (Service, ConfigMap,
Secret), when the operator runs with TANDEM_JOB_NETWORK_POLICY (the chart: `networkPolicy.enabled`
with `networkPolicy.scope: job`, the default). Pure: spec in, manifest out.

What crosses a job's pods: the rendezvous and the collectives' ports (NCCL/gloo pick theirs at
random, so every port is open between the job's own pods), the checkpoint engines' control APIs and
the shard server. Nothing outside the job needs any of it: the operator reads a job's progress from
etcd and never dials its pods. Unlike the namespace-wide policy (scope: namespace), a job's shard
server and control API are then out of reach of the other jobs of its namespace too. Extra sources
come from TANDEM_NETWORK_POLICY_EXTRA_FROM, the chart's `networkPolicy.extraFrom`: NetworkPolicyPeer
objects, as JSON, let in on every port. The Prometheus of the chart's monitors (`monitoring.scraper`,
TANDEM_NETWORK_POLICY_SCRAPE_FROM) is let in on the ports that serve /metrics only (`METRICS_PORTS`: the
driver's ce-trainer, every rollout's ce-rollout, by name), in a rule of its own. Egress is not restricted
(etcd, the image registry, a tracking server, model storage are all outside the job).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.operator.manifests import job_objects
from tandem.spec.models import RLHFJob

Manifest = dict[str, Any]


METRICS_PORTS = ("ce-trainer", "ce-rollout")  # the containers' port names (builders) that serve /metrics


def policy_name(job_name: str) -> str:
    return f"{job_name}-pods"


def build_network_policy(job: RLHFJob, *, owner_uid: str | None = None,
                         extra_from: Sequence[Manifest] = (), scrape_from: Sequence[Manifest] = ()) -> Manifest:
    name = job.metadata.name
    own = {"matchLabels": {job_objects.LABEL_JOB: name}}
    ingress: list[Manifest] = [{"from": [{"podSelector": own}, *extra_from]}]
    if scrape_from:
        ingress.append({"from": list(scrape_from),
                        "ports": [{"port": port, "protocol": "TCP"} for port in METRICS_PORTS]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": job_objects.object_metadata(job, policy_name(name), owner_uid, job_objects.job_labels(name)),
        "spec": {
            "podSelector": own,
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
