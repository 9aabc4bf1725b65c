"""Stand-ins for the API server in unit tests of `tandem.operator.reconcile.run`: the Kube calls a
pass makes, answered as a cluster that accepts them all, each create recorded as "Kind/name"."""

from __future__ import annotations

from typing import Any


class RecordingKube:
    def __init__(self) -> None:
        self.created: list[str] = []

    async def create(self, manifest: dict[str, Any]) -> bool:
        self.created.append(f"{manifest['kind']}/{manifest['metadata']['name']}")
        return True

    async def list_job_pods(self, namespace: str, job: str) -> list[Any]:
        return []

    async def patch_status(self, namespace: str, name: str, status: Any) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": "0"}}
