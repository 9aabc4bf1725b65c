"""Stand-ins for the API server in unit tests of `tandem.operator.runtime.reconcile.run`: the Kube calls a
pass makes, answered as a cluster that accepts them all, each create recorded as "Kind/name", each
delete as the pod's name (a PodDisruptionBudget's as "PodDisruptionBudget/name"), each status write
with the resourceVersion it was conditional on, each pod relabelled as (name, labels). A cluster whose
object moved on since the pass's view answers status writes with 409 (`moved_on`)."""

from __future__ import annotations

from typing import Any

from tandem.operator.cluster.kube import CONFLICT, KubeError


class RecordingKube:
    def __init__(self, moved_on: bool = False) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.status_writes: list[tuple[str, dict[str, Any]]] = []
        self.labelled: list[tuple[str, dict[str, str]]] = []
        self.moved_on = moved_on

    async def create(self, manifest: dict[str, Any]) -> bool:
        self.created.append(f"{manifest['kind']}/{manifest['metadata']['name']}")
        return True

    async def delete_pod(self, namespace: str, name: str) -> bool:
        self.deleted.append(name)
        return True

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> bool:
        self.labelled.append((name, dict(labels)))
        return True

    async def delete_pod_disruption_budget(self, namespace: str, name: str) -> None:
        self.deleted.append(f"PodDisruptionBudget/{name}")

    async def list_job_pods(self, namespace: str, job: str) -> list[Any]:
        return []

    async def patch_status(self, namespace: str, name: str, status: Any, resource_version: str = "") -> dict[str, Any]:
        if self.moved_on:
            raise KubeError(f"patch status of {namespace}/{name}", CONFLICT,
                            b'{"message": "the object has been modified"}')
        self.status_writes.append((resource_version, dict(status)))
        # the version written on stays current: a test may hand the next pass the same view
        return {"metadata": {"resourceVersion": resource_version or "0"}}


class NoProgress:
    """An etcd without a progress record (the driver has not reported yet)."""

    async def read_progress(self, *_: Any) -> None:
        return None
