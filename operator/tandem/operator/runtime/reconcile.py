"""One reconcile pass of one RLHFJob: observe, decide (pure), act, report.

Callers: the timer handler in `tandem.operator.runtime.handlers` (every reconcile interval, per job).
Observation: the spec (validated by `tandem.spec.load.parse_spec`), the status, the job's pods
(from the operator's pod index; re-listed from the API when a pod seems to be missing), the pods this
process created (`JobMemory.created`: one may run and go before any pass sees it), and the
progress record in etcd (from the second pass on). Decision: `tandem.operator.policies.plan.decide`.
Actions, after the decided status is written (conditional on the resourceVersion observed, so a
stale pass acts on nothing): ensure the Service, ConfigMap, Secret, the hybrid pods'
PodDisruptionBudget (`tandem.operator.manifests.disruption`; deleted instead while spec.podDisruptionBudget is
false) and, with
TANDEM_JOB_NETWORK_POLICY, the job's NetworkPolicy (`tandem.operator.manifests.netpol_builder`), all
create-if-absent (an existing token Secret is kept, never read; the job document's ConfigMap is
immutable and named by its content: a new metadata.generation that changes the document, e.g. a
/scale, gets a new one, which the pods started after it mount, so the operator never patches a
ConfigMap); with spec.gangScheduling the Workload and the gang's PodGroup (`tandem.operator.manifests.gang`)
before its pods; delete and create pods; post Events. A create the API server refuses
(`tandem.operator.policies.refusal_policy`) shows in the status (reason PodCreateRefused, the API server's
message) and is retried with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tandem.operator.cluster.etcd_store import EtcdStore, EtcdUnavailable
from tandem.operator.cluster.kube import CONFLICT, Kube, KubeError
from tandem.operator.manifests import builders, disruption, gang, gpu_sharing, job_objects, netpol_builder
from tandem.operator.policies import job_status, refusal_policy
from tandem.operator.policies.observe import PodState
from tandem.operator.policies.plan import Observation, Plan, decide
from tandem.spec.load import SpecError, parse_spec
from tandem.spec.models import RLHFJob
from tandem.spec.progress import Progress
from tandem.spec.status import JobStatus

log = logging.getLogger(__name__)


@dataclass
class JobMemory:
    """What the operator remembers of one job between passes (lost on restart, by design)."""

    parsed_generation: int = -1
    job: RLHFJob | None = None
    error: SpecError | None = None
    objects_ensured: bool = False
    written_rv: int = 0  # resourceVersion returned by our last status patch
    held: str = ""  # why the last pass created no pods although it meant to (a missing gang API), "" if none
    refused: str = ""  # the API server's message when it last refused a create ("" once creates succeed)
    refusals: int = 0  # refusals in a row
    retry_at: float = 0.0  # time.monotonic() before which no pod create is tried again
    # pods this process created (201) and has not deleted since: name -> gang generation. The pod index lags
    # the API, and a pod may run and go (an eviction) between two passes, before any pass saw it: a pass
    # that misses one of these asks the API, and plan.decide counts a rollout-only one that is gone as lost
    created: dict[str, int] = field(default_factory=dict)


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
    kube: Kube, ref: JobRef, indexed: Iterable[PodState], job: RLHFJob | None, current: JobStatus,
    created: Mapping[str, int] | None = None,
) -> list[PodState]:
    """The job's pods from the index; from the API when one that should be there is missing (the index
    may lag): any expected pod of a Running job, or one this operator created (`JobMemory.created`)."""
    pods = list(indexed)
    if job is None:
        return pods
    generation = job_status.gang_generation(current)
    names = {p.name for p in pods if p.generation == generation}
    should = job_objects.pod_names(job, generation) if current.phase == "Running" else []
    should += [name for name, gen in (created or {}).items() if gen == generation]
    if any(n not in names for n in should):
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


async def carry_out(kube: Kube, ref: JobRef, memory: JobMemory, plan: Plan, default_etcd: str,
                    policy_from: Sequence[Mapping[str, Any]] | None = None,
                    scrape_from: Sequence[Mapping[str, Any]] = ()) -> str:
    """Deletes first, then every create at once: pods need not wait for the Service, ConfigMap and
    Secret (the kubelet waits for the volumes they back), which halves the time to a started gang.
    Returns why pods were not created ("" when nothing stopped them)."""
    job = memory.job
    if plan.delete:
        await asyncio.gather(*(kube.delete_pod(ref.namespace, n) for n in plan.delete))
        for name in plan.delete:  # gone by our own hand: not a loss
            memory.created.pop(name, None)
    if plan.adopt:  # rollout-only pods kept through a gang restart join its generation (pool_policy.kept)
        labels = {job_objects.LABEL_GENERATION: str(plan.restart_generation)}
        labelled = await asyncio.gather(*(kube.label_pod(ref.namespace, n, labels) for n in plan.adopt),
                                        return_exceptions=True)
        for name, result in zip(plan.adopt, labelled, strict=True):
            if isinstance(result, KubeError):  # e.g. an older chart's RBAC without patch: a plain gang restart
                log.warning("could not keep pod %s/%s through the gang restart (%s): the next pass replaces it",
                            ref.namespace, name, result)
            elif isinstance(result, BaseException):
                raise result
    if job is not None and gang.creates_gang(job, plan.create):
        try:
            await ensure_gang(kube, job, ref, plan.restart_generation)
        except KubeError as e:
            if e.status != 404:
                raise
            return gang.UNAVAILABLE  # no pods: without the group they would not be gang-scheduled
    if job is not None and plan.create and gpu_sharing.uses_dra(job):  # the pods' ResourceClaims come from it
        owner = job_objects.owner_reference(ref.name, ref.uid) if ref.uid else None
        await kube.ensure_scheduling(gpu_sharing.claim_template(job, owner))
    creates: list[Awaitable[object]] = []
    objects = job is not None and (plan.create or (plan.ensure_objects and not memory.objects_ensured))
    if job is not None and objects:
        creates += [
            kube.create(job_objects.build_service(job, owner_uid=ref.uid)),
            kube.create(job_objects.build_spec_configmap(job, owner_uid=ref.uid)),
            kube.create(job_objects.build_token_secret(job, job_objects.new_token(), owner_uid=ref.uid)),
            kube.create(disruption.build_pod_disruption_budget(job, owner_uid=ref.uid))
            if job.spec.pod_disruption_budget  # opted out: the budget goes (a drain may take the pods now)
            else kube.delete_pod_disruption_budget(ref.namespace, disruption.budget_name(ref.name)),
        ]
        if policy_from is not None:
            creates.append(kube.create(netpol_builder.build_network_policy(
                job, owner_uid=ref.uid, extra_from=[dict(p) for p in policy_from],
                scrape_from=[dict(p) for p in scrape_from])))
    ensured = len(creates)
    pods = [] if job is None else [
        builders.build_pod(job, i, restart_generation=plan.restart_generation, owner_uid=ref.uid,
                           default_etcd=default_etcd)
        for i in plan.create
    ]
    creates += [kube.create(pod) for pod in pods]
    if creates:
        results = await asyncio.gather(*creates, return_exceptions=True)
        for pod, made in zip(pods, results[ensured:], strict=True):
            if made is True:  # a new pod (False: one of that name existed, perhaps of an older generation)
                memory.created[pod["metadata"]["name"]] = plan.restart_generation
        errors = [r for r in results if isinstance(r, BaseException)]
        refusals = [e for e in errors if isinstance(e, KubeError) and refusal_policy.refused(e.status)]
        others = [e for e in errors if e not in refusals]
        if others:
            raise others[0]
        if objects and not any(isinstance(r, BaseException) for r in results[:ensured]):
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
    policy_from: Sequence[Mapping[str, Any]] | None = None,
    scrape_from: Sequence[Mapping[str, Any]] = (),
) -> Plan | None:
    """One pass. Returns the plan carried out (None when skipped on a stale view, or when its status
    write found the object changed since the view was taken)."""
    if _stale_view(memory, ref):
        return None
    parse(memory, ref, spec)
    current = job_status.read_status(raw_status)
    job = memory.job
    if job is not None:  # labels change without a new metadata.generation
        job.metadata.labels = dict(ref.labels)
    endpoints = list(job.spec.checkpoint_engine.etcd.endpoints) if job else []
    # a job never reconciled (no condition yet) has no driver that could have reported: its first pass
    # creates the pods without an etcd round trip (100 new jobs at once: bench/operator_scale.py)
    reported = job is not None and bool(current.conditions)
    progress = await read_progress(etcd, endpoints or default_etcd, ref, logger) if reported else None
    pods = await observe_pods(kube, ref, indexed_pods, job, current, memory.created)
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
            created=dict(memory.created),
        )
    )
    if not plan.create:
        memory.refused, memory.refusals = "", 0
    elif memory.refused and time.monotonic() < memory.retry_at:
        plan.create = []  # refused a moment ago: the same request would be refused again
    # The decision is written before it is acted on, conditional on the version it was made from: a
    # pass on a stale view (a watch event not yet delivered, a former leader) gets 409 and acts on
    # nothing, so a gang failure is counted once and pods of a superseded decision are never made.
    decided, events, before = plan.status.model_copy(deep=True), list(plan.events), (memory.held, memory.refused)
    plan.events = events + annotate(plan.status, current, memory, bool(plan.create))  # as the last pass's went
    written = await write_status(kube, ref, memory, plan.status, raw_status, ref.resource_version)
    if written is None:
        return None
    memory.held = await carry_out(kube, ref, memory, plan, ",".join(default_etcd), policy_from, scrape_from)
    if (memory.held, memory.refused) != before:  # this pass's creates went otherwise
        plan.status = decided
        news = annotate(plan.status, current, memory, bool(plan.create))
        # announced only with the status that says it: when the object moved on in between (409), the
        # next pass writes it, and posts the Event then, once
        stored = await write_status(kube, ref, memory, plan.status, written[0], written[1])
        plan.events = events + (news if stored is not None else [])
    return plan


def annotate(new: JobStatus, current: JobStatus, memory: JobMemory, creating: bool) -> list[job_status.Event]:
    """Why pods are not being created, on top of the decided status of a pass that means to create
    them: a gang API that is missing or a create the API server refused. The same status every pass;
    an Event when it starts."""
    events: list[job_status.Event] = []
    if memory.held and creating:
        if current.message != memory.held:
            events.append(job_status.Event("Warning", gang.UNAVAILABLE_REASON, memory.held))
        job_status.set_phase(new, "Pending", memory.held, datetime.now(UTC), reason=gang.UNAVAILABLE_REASON)
    elif memory.refused and new.phase in ("Pending", "Queued", "Running"):
        if current.message != memory.refused or current.reason != refusal_policy.REASON:
            events.append(job_status.Event("Warning", refusal_policy.REASON, memory.refused))
        job_status.set_phase(new, new.phase, memory.refused, datetime.now(UTC), reason=refusal_policy.REASON)
    return events


async def write_status(kube: Kube, ref: JobRef, memory: JobMemory, new_status: JobStatus, raw_status: Any,
                       resource_version: str) -> tuple[dict[str, Any], str] | None:
    """Patch the status when it changed, on `resource_version` only. Returns the status now stored and
    the resourceVersion to write on next; None when the object moved on (409: this pass's view is stale)."""
    new = _clean(job_status.dump_status(new_status))
    stored = _clean(raw_status if isinstance(raw_status, Mapping) else {})
    if new == stored:
        return new, resource_version
    cleared = {k: None for k in stored if k not in new}  # a merge patch removes a field only by a null
    try:
        patched = await kube.patch_status(ref.namespace, ref.name, cleared | new, resource_version)
    except KubeError as e:
        if e.status != CONFLICT:
            raise
        return None
    rv = str(patched.get("metadata", {}).get("resourceVersion", "0"))
    try:
        memory.written_rv = int(rv)
    except ValueError:
        memory.written_rv = 0
    return new, rv
