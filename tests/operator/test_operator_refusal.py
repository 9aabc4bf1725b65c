"""Pod creates the API server refuses: the refusal policy's table, and `reconcile.run` against a stand-in
that refuses pods as Pod Security admission does (the real admission: test_operator_pod_security.py).
A refused job shows PodCreateRefused with the API server's message, posts one Event, and asks again
only after the backoff: neither pods nor the job's other objects are re-sent on every pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from fakes import RecordingKube
from wrappers import JobWrapper

from tandem.operator.cluster.kube import KubeError
from tandem.operator.policies import job_status, refusal_policy
from tandem.operator.runtime import reconcile

FORBIDDEN = 'pods "demo-0" is forbidden: violates PodSecurity "restricted:latest": hostPath volumes (volume "vol-d")'


@pytest.mark.parametrize(("code", "refused"), [(400, True), (403, True), (422, True), (409, False), (500, False),
                                               (503, False), (404, False)])
def test_which_answers_are_refusals(code: int, refused: bool) -> None:
    assert refusal_policy.refused(code) is refused


@pytest.mark.parametrize(("n", "delay"), [(1, 5.0), (2, 10.0), (3, 20.0), (7, 300.0), (1000, 300.0)])
def test_retry_delay_doubles_up_to_five_minutes(n: int, delay: float) -> None:
    assert refusal_policy.retry_delay(n) == delay


class RefusingKube(RecordingKube):
    """Accepts Services, ConfigMaps and Secrets; refuses pods with a 403 while `refuse` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = True
        self.attempts: list[str] = []

    async def create(self, manifest: dict[str, Any]) -> bool:
        self.attempts.append(f"{manifest['kind']}/{manifest['metadata']['name']}")
        if manifest["kind"] == "Pod" and self.refuse:
            raise KubeError("create Pod", 403, json.dumps({"message": FORBIDDEN}))
        return await super().create(manifest)


class NoEtcd:
    async def read_progress(self, *_: Any) -> None:
        return None


def one_pass(kube: RefusingKube, memory: reconcile.JobMemory, raw: dict[str, Any]) -> Any:
    plan = asyncio.run(reconcile.run(
        kube=kube, etcd=NoEtcd(), memory=memory, ref=reconcile.JobRef("ns", "demo", "uid", 1, "1"),  # type: ignore[arg-type]
        spec=JobWrapper("demo").small().obj()["spec"], raw_status=raw, indexed_pods=(),
        default_etcd=["http://etcd:2379"], logger=logging.getLogger("t")))
    assert plan is not None
    return plan


def test_a_refused_pod_shows_once_and_waits_for_the_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(reconcile.time, "monotonic", lambda: clock[0])
    kube, memory = RefusingKube(), reconcile.JobMemory()
    plan = one_pass(kube, memory, {})
    st = plan.status
    assert (st.phase, st.reason, st.message) == ("Pending", "PodCreateRefused", FORBIDDEN)
    ready = job_status.condition(st, "Ready")
    assert ready is not None and (ready.reason, ready.message) == ("PodCreateRefused", FORBIDDEN)
    assert [(e.type, e.reason, e.message) for e in plan.events if e.reason == "PodCreateRefused"] == [
        ("Warning", "PodCreateRefused", FORBIDDEN)]
    assert sorted(kube.attempts) == ["ConfigMap/" + kube.created[1].split("/")[1], "Pod/demo-0",
                                     "PodDisruptionBudget/demo-hybrid", "Secret/demo-token", "Service/demo"]
    raw = job_status.dump_status(st)
    for _ in range(10):  # ten passes within the first 5 s: nothing sent, the status and no new Event
        clock[0] += 0.4
        kube.attempts.clear()
        plan = one_pass(kube, memory, raw)
        assert kube.attempts == [] and plan.status.reason == "PodCreateRefused"
        assert not [e for e in plan.events if e.reason == "PodCreateRefused"]
        raw = job_status.dump_status(plan.status)
    clock[0] += 1.1  # 5.1 s after the refusal: one retry, refused again, then 10 s
    plan = one_pass(kube, memory, raw)
    assert [a for a in kube.attempts if a.startswith("Pod/")] == ["Pod/demo-0"]  # (with the objects, as any pod)
    assert memory.refusals == 2 and memory.retry_at == clock[0] + 10
    kube.refuse, clock[0] = False, clock[0] + 10  # the namespace was relabelled; the next retry succeeds
    kube.attempts.clear()
    plan = one_pass(kube, memory, job_status.dump_status(plan.status))
    assert [a for a in kube.attempts if a.startswith("Pod/")] == ["Pod/demo-0"]
    assert memory.refused == "" and memory.refusals == 0
    assert plan.status.reason == "PodsPending" and plan.status.message == "waiting for 1 of 1 pods"


class MovesOnOnce(RefusingKube):
    """The object changes between a pass's two status writes (kopf's own bookkeeping, a user's edit):
    the second write of the first pass gets 409."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    async def patch_status(self, namespace: str, name: str, status: Any, resource_version: str = "") -> dict[str, Any]:
        self.writes += 1
        if self.writes == 2:
            raise KubeError(f"patch status of {namespace}/{name}", 409, b'{"message": "the object has been modified"}')
        return await super().patch_status(namespace, name, status, resource_version)


def test_a_refusal_whose_status_write_conflicts_is_announced_once_by_the_pass_that_writes_it() -> None:
    kube, memory = MovesOnOnce(), reconcile.JobMemory()
    first = one_pass(kube, memory, {})
    assert not [e for e in first.events if e.reason == "PodCreateRefused"]  # its status was not stored
    stored = kube.status_writes[-1][1]
    assert stored["phase"] == "Pending" and stored["message"] != FORBIDDEN
    second = one_pass(kube, memory, stored)  # within the backoff: no create, the refusal written now
    assert [(e.reason, e.message) for e in second.events] == [("PodCreateRefused", FORBIDDEN)]
    assert kube.status_writes[-1][1]["message"] == FORBIDDEN
    third = one_pass(kube, memory, kube.status_writes[-1][1])
    assert not [e for e in third.events if e.reason == "PodCreateRefused"]
