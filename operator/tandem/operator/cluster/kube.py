"""Thin asyncio access to the Kubernetes API for the handlers: create-if-absent, delete, list, status.

Callers: `tandem.operator.runtime.reconcile` and `tandem.operator.runtime.handlers`. Every call is idempotent in
the way reconciliation needs: creating an object that exists (409) is success, deleting one that is
gone (404) is success. Responses are not deserialised into client models (they are not needed and
cost CPU at scale); reads return plain dicts.

Credentials: in a pod, the ServiceAccount (in-cluster config); elsewhere $KUBECONFIG or
~/.kube/config (the tests hand the operator a kubeconfig holding the chart ServiceAccount's token).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Mapping
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from tandem.operator.manifests import gang
from tandem.operator.manifests.job_objects import LABEL_JOB, Manifest
from tandem.operator.policies.observe import PodState, pod_state
from tandem.spec.models import GROUP, PLURAL, VERSION

MERGE_PATCH = "application/merge-patch+json"
CONFLICT = 409  # a write conditional on a resourceVersion that is no longer current


class KubeError(RuntimeError):
    """An API call failed for a reason other than the object existing / being gone."""

    def __init__(self, action: str, status: int, body: str | bytes | None, reason: str = ""):
        self.status = status
        try:
            reason = json.loads(body or "{}").get("message", reason)
        except (TypeError, ValueError, AttributeError):
            pass
        self.message = reason  # the API server's own words (e.g. which PodSecurity rule or quota refused it)
        super().__init__(f"{action}: HTTP {self.status}: {reason}")

    @classmethod
    def of(cls, action: str, exc: ApiException) -> KubeError:
        return cls(action, int(exc.status or 0), exc.body, exc.reason or "")


async def connect(max_connections: int = 64, kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient from in-cluster credentials, else from the kubeconfig (`kubeconfig`, $KUBECONFIG or
    ~/.kube/config)."""
    conf = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(config_file=kubeconfig or os.environ.get("KUBECONFIG"),
                                      client_configuration=conf, persist_config=False)
    conf.connection_pool_maxsize = max_connections
    return client.ApiClient(configuration=conf)


class Kube:
    """The few API operations the operator performs, against one ApiClient."""

    def __init__(self, api: client.ApiClient):
        self.api = api
        # Typed as Any: calls pass _preload_content=False and get raw aiohttp responses back.
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.networking: Any = client.NetworkingV1Api(api)
        self.policy: Any = client.PolicyV1Api(api)

    async def close(self) -> None:
        await self.api.close()

    async def _send(self, action: str, call: Awaitable[Any], tolerate: int = 0) -> Any:
        """The raw response of an API call made with _preload_content=False (the client raises on
        an error status only when it preloads): None when it answered `tolerate` (409 on create,
        404 on delete), KubeError on any other status outside 2xx."""
        try:
            resp = await call
        except ApiException as e:
            if e.status == tolerate:
                return None
            raise KubeError.of(action, e) from None
        if 200 <= resp.status < 300:
            return resp
        body = await resp.read()
        resp.release()
        if resp.status == tolerate:
            return None
        raise KubeError(action, int(resp.status), body, str(resp.reason or ""))

    async def create(self, manifest: Manifest) -> bool:
        """Create if absent. True when created, False when it already existed."""
        kind, ns = manifest["kind"], manifest["metadata"]["namespace"]
        creators = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
            "Secret": self.core.create_namespaced_secret,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
            "PodDisruptionBudget": self.policy.create_namespaced_pod_disruption_budget,
        }
        action = f"create {kind} {ns}/{manifest['metadata']['name']}"
        resp = await self._send(action, creators[kind](ns, manifest, _preload_content=False), tolerate=409)
        if resp is None:
            return False
        resp.release()
        return True

    async def ensure_scheduling(self, manifest: Manifest) -> dict[str, Any]:
        """Create a Workload or PodGroup (scheduling.k8s.io/v1alpha2) if absent; returns the object
        as stored (created now, or read back when it already existed)."""
        ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        group, version = manifest["apiVersion"].split("/")
        plural = f"{manifest['kind'].lower()}s"
        action = f"create {manifest['kind']} {ns}/{name}"
        call = self.custom.create_namespaced_custom_object(group, version, ns, plural, manifest,
                                                           _preload_content=False)
        resp = await self._send(action, call, tolerate=409)
        if resp is None:
            call = self.custom.get_namespaced_custom_object(group, version, ns, plural, name, _preload_content=False)
            resp = await self._send(f"get {manifest['kind']} {ns}/{name}", call)
        body: dict[str, Any] = json.loads(await resp.read())
        return body

    async def list_pod_groups(self, namespace: str, job: str) -> list[dict[str, Any]]:
        call = self.custom.list_namespaced_custom_object(
            gang.API_GROUP, gang.API_VERSION_WORKLOAD, namespace, gang.PODGROUPS,
            label_selector=f"{LABEL_JOB}={job}", _preload_content=False)
        resp = await self._send(f"list PodGroups of {namespace}/{job}", call)
        items: list[dict[str, Any]] = json.loads(await resp.read()).get("items", [])
        return items

    async def delete_pod_group(self, namespace: str, name: str) -> None:
        call = self.custom.delete_namespaced_custom_object(
            gang.API_GROUP, gang.API_VERSION_WORKLOAD, namespace, gang.PODGROUPS, name, _preload_content=False)
        resp = await self._send(f"delete PodGroup {namespace}/{name}", call, tolerate=404)
        if resp is not None:
            resp.release()

    async def delete_pod(self, namespace: str, name: str) -> bool:
        """Graceful delete; True when a delete was issued, False when the pod was already gone."""
        call = self.core.delete_namespaced_pod(name, namespace, _preload_content=False)
        resp = await self._send(f"delete Pod {namespace}/{name}", call, tolerate=404)
        if resp is None:
            return False
        resp.release()
        return True

    async def label_pod(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        """Merge-patch a pod's labels; False when the pod is gone."""
        call = self.core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": dict(labels)}},
                                              _content_type=MERGE_PATCH, _preload_content=False)
        resp = await self._send(f"label Pod {namespace}/{name}", call, tolerate=404)
        if resp is None:
            return False
        resp.release()
        return True

    async def delete_pod_disruption_budget(self, namespace: str, name: str) -> None:
        call = self.policy.delete_namespaced_pod_disruption_budget(name, namespace, _preload_content=False)
        resp = await self._send(f"delete PodDisruptionBudget {namespace}/{name}", call, tolerate=404)
        if resp is not None:
            resp.release()

    async def list_job_pods(self, namespace: str, job: str) -> list[PodState]:
        call = self.core.list_namespaced_pod(namespace, label_selector=f"{LABEL_JOB}={job}", _preload_content=False)
        resp = await self._send(f"list pods of {namespace}/{job}", call)
        data = json.loads(await resp.read())
        states = (pod_state(item) for item in data.get("items", []))
        return [s for s in states if s is not None]

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any],
                           resource_version: str = "") -> dict[str, Any]:
        """Merge-patch the RLHFJob status subresource; returns the patched object. With a
        resource_version the API server applies it only to that version of the object (KubeError 409
        otherwise): a pass decided on an older view never overwrites what a newer one wrote."""
        patch: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        call = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, patch, _content_type=MERGE_PATCH, _preload_content=False,
        )
        resp = await self._send(f"patch status of {namespace}/{name}", call)
        body: dict[str, Any] = json.loads(await resp.read())
        return body
