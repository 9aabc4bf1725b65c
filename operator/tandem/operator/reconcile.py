"""One reconcile pass of one RLHFJob: observe, decide (pure), act, report.

Callers: the timer handler in `tandem.operator.handlers` (every reconcile interval, per job).
Observation: the spec (validated by `tandem.spec.load.parse_spec`), the status, the job's pods
(from the operator's pod index; re-listed from the API when a pod seems to be missing), and the
progress record in etcd (from the second pass on). Decision: `tandem.operator.plan.decide`.
Actions: ensure the Service, ConfigMap and Secret (create-if-absent: an existing token Secret is
kept, never read; the job document's ConfigMap is immutable and named by its content: a new
metadata.generation that changes the document, e.g. a /scale, gets a new one, which the pods started
after it mount, so the operator never patches a ConfigMap), with spec.gangScheduling the Workload
and the gang's PodGroup (`tandem.operator.gang`) before its pods, delete and create pods, patch the
status subresource, post Events. A create the API server refuses (`tandem.operator.refusal_policy`)
shows in the status (reason PodCreateRefused, the API server's message) and is retried with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tandem.operator import builders, gang, gpu_sharing, refusal_policy, status
from tandem.operator.etcd_store import EtcdStore, EtcdUnavailable
from tandem.operator.kube import Kube, KubeError
from tandem.operator.observe import PodState
from tandem.operator.plan import Observation, Plan, decide
from tandem.spec.load import SpecError, parse_spec
from tandem.spec.models import JobStatus, RLHFJob
from tandem.spec.progress import Progress


@dataclass
class JobMemory:
    """What the operator remembers of one job between passes (lost on restart, by design)."""

    parsed_generation: int = -1
    job: RLHFJob | None = None
    error: SpecError | None = None
    objects_ensured: bool = False
    written_rv: int = 0  # resourceVersion returned by our last status patch
    refused: str = ""  # the API server's message when it last refused a create ("" once creates succeed)
    refusals: int = 0  # refusals in a row
    retry_at: float = 0.0  # time.monotonic() before which no pod create is tried again


@dataclass(frozen=True)
class JobRef:
    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str
    labels: Mapping[str, str] = field(default_factory=dict)  # kueue.x-k8s.io/queue-name queues the pods


def parse(memory: JobMemory, ref: JobRef, spec: Mapping[str, Any]) -> None:
    """Validate the spec once per metadata.generation."""
    if memory.parsed_generation == ref.generation:
        return
    try:
        job = parse_spec(dict(spec), name=ref.name, source=f"{ref.namespace}/{ref.name}")
        job.metadata.namespace = ref.namespace
        memory.job, memory.error = job, None
    except SpecError as e:
        memory.job, memory.error = None, e
    memory.parsed_generation = ref.generation
    memory.objects_ensured = False


def _stale_view(memory: JobMemory, ref: JobRef) -> bool:
    """True while the watched body is older than our own last status write."""
    try:
        return int(ref.resource_version) < memory.written_rv
    except ValueError:
        return False


def _clean(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


async def observe_pods(
    kube: Kube, ref: JobRef, indexed: Iterable[PodState], job: RLHFJob | None, current: JobStatus
) -> list[PodState]:
    pods = list(indexed)
    if job is not None and current.phase == "Running":
        names = {p.name for p in pods}
        generation = status.gang_generation(current)
        if any(n not in names for n in builders.pod_names(job, generation)):  # the index may lag: ask the API
            pods = await kube.list_job_pods(ref.namespace, ref.name)
    return pods


async def read_progress(
    etcd: EtcdStore, endpoints: Sequence[str], ref: JobRef, logger: logging.Logger
) -> Progress | None:
    try:
        return await etcd.read_progress(endpoints, ref.namespace, ref.name, ref.uid)
    except EtcdUnavailable as e:
        logger.warning(f"progress unavailable: {e}")
        return None


async def ensure_gang(kube: Kube, job: RLHFJob, ref: JobRef, generation: int) -> None:
    """The Workload and this gang's PodGroup exist before its pods (the scheduler would hold the pods
    until the group appears anyway; creating it first saves a retry), earlier gangs' groups go."""
    workload = await kube.ensure_scheduling(gang.build_workload(job, owner_uid=ref.uid))
    uid = str((workload.get("metadata") or {}).get("uid") or "") or None
    await kube.ensure_scheduling(gang.build_pod_group(job, generation, owner_uid=ref.uid, workload_uid=uid))
    stale = gang.stale_groups(await kube.list_pod_groups(ref.namespace, ref.name), generation)
    await asyncio.gather(*(kube.delete_pod_group(ref.namespace, n) for n in stale))


async def carry_out(kube: Kube, ref: JobRef, memory: JobMemory, plan: Plan, default_etcd: str) -> str:
    """Deletes first, then every create at once: pods need not wait for the Service, ConfigMap and
    Secret (the kubelet waits for the volumes they back), which halves the time to a started gang.
    Returns why pods were not created ("" when nothing stopped them)."""
    job = memory.job
    if plan.delete:
        await asyncio.gather(*(kube.delete_pod(ref.namespace, n) for n in plan.delete))
    if job is not None and gang.creates_gang(job, plan.create):
        try:
            await ensure_gang(kube, job, ref, plan.restart_generation)
        except KubeError as e:
            if e.status != 404:
                raise
            return gang.UNAVAILABLE  # no pods: without the group they would not be gang-scheduled
    if job is not None and plan.create and gpu_sharing.uses_dra(job):  # the pods' ResourceClaims come from it
        owner = builders.owner_reference(ref.name, ref.uid) if ref.uid else None
        await kube.ensure_scheduling(gpu_sharing.claim_template(job, owner))
    creates: list[Awaitable[object]] = []
    objects = job is not None and (plan.create or (plan.ensure_objects and not memory.objects_ensured))
    if job is not None and objects:
        creates += [
            kube.create(builders.build_service(job, owner_uid=ref.uid)),
            kube.create(builders.build_spec_configmap(job, owner_uid=ref.uid)),
            kube.create(builders.build_token_secret(job, builders.new_token(), owner_uid=ref.uid)),
        ]
    if job is not None:
        creates += [
            kube.create(
                builders.build_pod(
                    job,
                    i,
                    restart_generation=plan.restart_generation,
                    owner_uid=ref.uid,
                    default_etcd=default_etcd,
                )
            )
            for i in plan.create
        ]
    if creates:
        results = await asyncio.gather(*creates, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        refusals = [e for e in errors if isinstance(e, KubeError) and refusal_policy.refused(e.status)]
        others = [e for e in errors if e not in refusals]
        if others:
            raise others[0]
        if objects and not any(isinstance(r, BaseException) for r in results[:3]):
            memory.objects_ensured = True
        if refusals:
            memory.refusals += 1
            memory.refused = refusals[0].message or str(refusals[0])
            memory.retry_at = time.monotonic() + refusal_policy.retry_delay(memory.refusals)
        else:
            memory.refused, memory.refusals = "", 0
    return ""


async def run(
    *,
    kube: Kube,
    etcd: EtcdStore,
    memory: JobMemory,
    ref: JobRef,
    spec: Mapping[str, Any],
    raw_status: Any,
    indexed_pods: Iterable[PodState],
    default_etcd: Sequence[str],
    logger: logging.Logger,
) -> Plan | None:
    """One pass. Returns the plan carried out (None when skipped on a stale view)."""
    if _stale_view(memory, ref):
        return None
    parse(memory, ref, spec)
    current = status.read_status(raw_status)
    job = memory.job
    if job is not None:  # labels change without a new metadata.generation
        job.metadata.labels = dict(ref.labels)
    endpoints = list(job.spec.checkpoint_engine.etcd.endpoints) if job else []
    # a job never reconciled (no condition yet) has no driver that could have reported: its first pass
    # creates the pods without an etcd round trip (100 new jobs at once: bench/operator_scale.py)
    reported = job is not None and bool(current.conditions)
    progress = await read_progress(etcd, endpoints or default_etcd, ref, logger) if reported else None
    pods = await observe_pods(kube, ref, indexed_pods, job, current)
    plan = decide(
        Observation(
            name=ref.name,
            generation=ref.generation,
            job=job,
            spec_error=memory.error,
            status=current,
            pods=pods,
            progress=progress,
            now=datetime.now(UTC),
        )
    )
    if not plan.create:
        memory.refused, memory.refusals = "", 0
    elif memory.refused and time.monotonic() < memory.retry_at:
        plan.create = []  # refused a moment ago: the same request would be refused again
    held = await carry_out(kube, ref, memory, plan, ",".join(default_etcd))
    if held:  # the same status every pass, one Event
        if current.message != held:
            plan.events.append(status.Event("Warning", gang.UNAVAILABLE_REASON, held))
        status.set_phase(plan.status, "Pending", held, datetime.now(UTC), reason=gang.UNAVAILABLE_REASON)
    elif memory.refused and plan.status.phase in ("Pending", "Queued", "Running"):
        if current.message != memory.refused or current.reason != refusal_policy.REASON:
            plan.events.append(status.Event("Warning", refusal_policy.REASON, memory.refused))
        status.set_phase(plan.status, plan.status.phase, memory.refused, datetime.now(UTC),
                         reason=refusal_policy.REASON)
    new = _clean(status.dump_status(plan.status))
    if new != _clean(raw_status if isinstance(raw_status, Mapping) else {}):
        patched = await kube.patch_status(ref.namespace, ref.name, new)
        try:
            memory.written_rv = int(patched.get("metadata", {}).get("resourceVersion", "0"))
        except ValueError:
            memory.written_rv = 0
    return plan
