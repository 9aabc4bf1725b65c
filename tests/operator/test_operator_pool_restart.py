"""The rollout-only pool's replacement counts survive an operator restart: they live in the job's status
(status.rolloutReplacements, status.rolloutPool: the pods counted and not yet replaced, the hour's window and
its count), not in the operator's memory (`reconcile.JobMemory`, lost on restart by design).

Each pass here is `reconcile.run` of a fresh process (a new JobMemory, a new stand-in API server) reading the
status the previous process patched, as the API server stores it: pruned to the CRD's status schema (a field
the schema lacks would be dropped on write, and its count lost) and through JSON. A pod counted before the
restart is not counted again after it; the crash-loop bound keeps counting across restarts, and trips.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fakes import NoProgress, RecordingKube
from test_operator_pool import healthy, pod, pool_job
from wrappers import StatusWrapper

from tandem.operator.policies import job_status, pool_policy
from tandem.operator.policies.observe import PodState
from tandem.operator.runtime import reconcile
from tandem.spec import crd
from tandem.spec.status import ReplacingPod, RolloutPoolStatus


def status_schema() -> dict[str, Any]:
    version = crd.build_crd()["spec"]["versions"][0]
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["status"])


def prune(value: Any, schema: dict[str, Any]) -> Any:
    """What a structural schema keeps of `value` (the API server drops unknown fields on write)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or value is None:
        return value
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        return {k: prune(v, props[k]) for k, v in value.items() if k in props}
    if isinstance(value, list) and "items" in schema:
        return [prune(v, schema["items"]) for v in value]
    return value


def stored(kube: RecordingKube, before: dict[str, Any]) -> dict[str, Any]:
    """The status the API server holds after the pass's merge patches (nulls remove a field)."""
    raw = dict(before)
    for _, patch in kube.status_writes:
        raw = {k: v for k, v in (raw | patch).items() if v is not None}
    return dict(json.loads(json.dumps(prune(raw, status_schema()))))


def fresh_operator_pass(raw: dict[str, Any], pods: list[PodState], max_restarts: int = 1) -> tuple[Any, dict[str, Any]]:
    """One pass of a newly started operator process on the stored status; returns its plan and the status stored
    after it."""
    kube, memory = RecordingKube(), reconcile.JobMemory()
    plan = asyncio.run(reconcile.run(
        kube=kube, etcd=NoProgress(), memory=memory,  # type: ignore[arg-type]
        ref=reconcile.JobRef("ns", "demo", "uid", 1, "7"), spec=pool_job(max_restarts).obj()["spec"],
        raw_status=raw, indexed_pods=pods, default_etcd=["http://etcd:2379"], logger=logging.getLogger("t")))
    assert plan is not None
    return plan, stored(kube, raw)


def test_the_status_schema_keeps_every_field_of_the_pool_record() -> None:
    st = StatusWrapper().phase("Running").rollout_only(2).get()
    st.rollout_replacements = 3
    st.rollout_pool = RolloutPoolStatus(
        replacing=[ReplacingPod(pod="demo-2", uid="uid-2", generation=0)],
        window_start="2026-01-01T00:00:00Z", window_replacements=3)
    dumped = job_status.dump_status(st)
    assert prune(dumped, status_schema()) == dumped


def test_a_restarted_operator_continues_the_pools_counts_and_its_crash_loop_bound() -> None:
    running = job_status.dump_status(StatusWrapper().phase("Running").rollout_only(2).get())
    lost = healthy()[:2] + [pod(2, "a").failed().state()]
    first, raw = fresh_operator_pass(running, lost)  # bound: max(1, 1) x 2 = 2 replacements an hour
    assert first.delete == ["demo-2"] and first.status.rollout_replacements == 1
    assert raw["rolloutReplacements"] == 1 and raw["rolloutPool"]["windowReplacements"] == 1

    again, raw = fresh_operator_pass(raw, lost)  # restarted before the replacement exists: counted once
    assert again.status.rollout_replacements == 1 and raw["rolloutPool"]["windowReplacements"] == 1
    assert [e for e in again.events if e.reason == pool_policy.REPLACED] == []

    replaced, raw = fresh_operator_pass(raw, healthy())
    assert replaced.status.rollout_replacements == 1 and raw["rolloutPool"]["replacing"] == []
    second, raw = fresh_operator_pass(raw, healthy()[:2] + [pod(2, "b").failed().state()])
    assert second.status.phase == "Running" and second.status.rollout_replacements == 2
    assert raw["rolloutPool"]["windowReplacements"] == 2

    _, raw = fresh_operator_pass(raw, healthy())
    third, raw = fresh_operator_pass(raw, healthy()[:2] + [pod(2, "c").failed().state()])
    assert third.status.reason == pool_policy.LIMIT and third.status.restarts == 1, third.status.message
    assert "3 rollout-only pods lost within 60 minutes" in third.status.message
    assert raw["restarts"] == 1 and "rolloutPool" not in raw  # the gang restarts; the record starts afresh
