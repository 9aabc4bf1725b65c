"""A reconcile pass writes its decision before acting on it, conditional on the resourceVersion it
observed; a pass whose view is stale (the object moved on: a watch event not yet delivered, or a
former leader still running) acts on nothing. Unit level, with the API server's answers recorded
(`fakes.RecordingKube`); tests/operator/test_operator_leader.py shows the real API server's 409 and a
leader killed mid-job."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fakes import NoProgress, RecordingKube
from wrappers import JobWrapper, PodWrapper, StatusWrapper

from tandem.operator.policies import job_status
from tandem.operator.policies.observe import PodState
from tandem.operator.runtime import reconcile


def one_pass(kube: RecordingKube, memory: reconcile.JobMemory, raw: dict[str, Any], pods: list[PodState],
             rv: str = "41") -> Any:
    return asyncio.run(reconcile.run(
        kube=kube, etcd=NoProgress(), memory=memory, ref=reconcile.JobRef("ns", "demo", "uid", 1, rv),  # type: ignore[arg-type]
        spec=JobWrapper("demo").small().replicas(2).failure_policy(3).obj()["spec"], raw_status=raw,
        indexed_pods=pods, default_etcd=["http://etcd:2379"], logger=logging.getLogger("t")))


def running_with_a_failed_pod() -> tuple[dict[str, Any], list[PodState]]:
    raw = job_status.dump_status(StatusWrapper().phase("Running").get())
    return raw, [PodWrapper("demo", 0, replicas=2).running().state(),
                 PodWrapper("demo", 1, replicas=2).failed().state()]


def test_a_gang_failure_is_written_conditionally_then_acted_on() -> None:
    kube, (raw, pods) = RecordingKube(), running_with_a_failed_pod()
    plan = one_pass(kube, reconcile.JobMemory(), raw, pods)
    assert plan is not None and plan.status.restarts == 1 and plan.status.phase == "Restarting"
    assert [(rv, st["restarts"], st["phase"]) for rv, st in kube.status_writes] == [("41", 1, "Restarting")]
    assert sorted(kube.deleted) == ["demo-0", "demo-1"]


def test_a_stale_pass_counts_no_restart_and_touches_no_pod() -> None:
    """The same view handed to a second pass after the first one wrote (as a former leader, or a
    replica whose watch lags, would hold it): the API server refuses the write, nothing is deleted,
    created or posted."""
    kube, (raw, pods) = RecordingKube(moved_on=True), running_with_a_failed_pod()
    memory = reconcile.JobMemory()
    assert one_pass(kube, memory, raw, pods) is None
    assert kube.deleted == [] and kube.created == [] and kube.status_writes == []
    assert memory.written_rv == 0  # nothing it wrote to wait for


def test_a_new_job_writes_pending_before_its_pods_and_only_once() -> None:
    kube, memory = RecordingKube(), reconcile.JobMemory()
    plan = one_pass(kube, memory, {}, [])
    assert plan is not None and plan.status.phase == "Pending"
    assert len(kube.status_writes) == 1 and kube.status_writes[0][0] == "41"
    assert {"Pod/demo-0", "Pod/demo-1"} <= set(kube.created)
    assert memory.written_rv == 41


def test_a_pass_that_creates_nothing_never_writes_the_last_passes_gang_wait() -> None:
    """The gang API was missing when the last pass meant to create pods (memory.held); a pass that
    suspends the job writes Suspended once, never the stale 'waiting for the gang API' status."""
    kube, memory = RecordingKube(), reconcile.JobMemory(held="no gang API")
    raw = job_status.dump_status(StatusWrapper().phase("Pending").get())
    plan = asyncio.run(reconcile.run(
        kube=kube, etcd=NoProgress(), memory=memory, ref=reconcile.JobRef("ns", "demo", "uid", 1, "41"),  # type: ignore[arg-type]
        spec=JobWrapper("demo").small().suspend().obj()["spec"], raw_status=raw, indexed_pods=[],
        default_etcd=["http://etcd:2379"], logger=logging.getLogger("t")))
    assert plan is not None and plan.status.phase == "Suspended"
    assert [st["phase"] for _, st in kube.status_writes] == ["Suspended"] and memory.held == ""
