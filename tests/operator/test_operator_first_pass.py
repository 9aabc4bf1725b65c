"""A new job's first reconcile pass creates its pods without asking etcd; later passes read progress.

With 100 jobs created at once the etcd round trip sat on every job's path to its pods
(bench/operator_scale.py). Unit level: `reconcile.run` with recording stand-ins for the API server
and etcd (the same calls the real ones answer in tests/operator/test_operator_cluster.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fakes import RecordingKube
from wrappers import JobWrapper

from tandem.operator.policies import job_status
from tandem.operator.runtime import reconcile
from tandem.spec.progress import Progress


class DoneRecord:
    """An etcd holding a finished driver's record (as a deleted job of the same name may leave)."""

    def __init__(self) -> None:
        self.reads = 0

    async def read_progress(self, *_: Any) -> Progress:
        self.reads += 1
        return Progress(phase="done", iteration=3, iterations=3)


def one_pass(kube: RecordingKube, etcd: DoneRecord, memory: reconcile.JobMemory, raw: dict[str, Any],
             rv: str = "1") -> Any:
    plan = asyncio.run(reconcile.run(
        kube=kube, etcd=etcd, memory=memory, ref=reconcile.JobRef("ns", "demo", "uid", 1, rv),  # type: ignore[arg-type]
        spec=JobWrapper("demo").small().rollout_only(1).obj()["spec"], raw_status=raw, indexed_pods=(),
        default_etcd=["http://etcd:2379"], logger=logging.getLogger("t")))
    assert plan is not None
    return plan


def test_the_first_pass_creates_pods_without_reading_etcd_and_the_next_reads_it() -> None:
    kube, etcd, memory = RecordingKube(), DoneRecord(), reconcile.JobMemory()
    first = one_pass(kube, etcd, memory, {})
    assert etcd.reads == 0
    assert {"Pod/demo-0", "Pod/demo-1"} <= set(kube.created) and first.status.phase == "Pending"
    second = one_pass(kube, etcd, memory, job_status.dump_status(first.status), rv=str(memory.written_rv))
    assert etcd.reads == 1 and second.status.phase == "Succeeded"  # the record is read from now on
