"""The in-flight record (`tandem.sidecars.trainer.loop.recovery.inflight`) in a real etcd.

What a restart re-generates: the carried prompts of partial rollouts and the next asynchronous
batch, recorded with the version just published; only a resume from that same version uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.sidecars.trainer.loop.recovery import inflight
from tandem.sidecars.trainer.loop.recovery.inflight import Inflight


@pytest.fixture
def registry(etcd_server: Any) -> Iterator[Callable[[str], SyncRegistry]]:
    made: list[SyncRegistry] = []

    def make(job: str) -> SyncRegistry:
        reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "trainer", ttl=5, timeout=2.0).connect()
        made.append(reg)
        return reg

    yield make
    for reg in made:
        reg.close()


def test_a_record_loads_with_its_own_version_only(registry: Callable[[str], SyncRegistry]) -> None:
    reg = registry("inflight-a")
    assert inflight.load(reg, 3) is None  # nothing recorded yet
    inflight.save(reg, Inflight(3, prompts=[7, 2, 11], next_batch=None))
    assert inflight.load(reg, 3) == Inflight(3, [7, 2, 11], None)
    assert inflight.load(reg, 2) is None  # an older durable copy: start afresh
    assert inflight.load(reg, 4) is None

    inflight.save(reg, Inflight(4, next_batch=9))  # the next version replaces it
    assert inflight.load(reg, 4) == Inflight(4, [], 9)
    assert inflight.load(reg, 3) is None


def test_records_are_per_job_and_outlive_the_writer(registry: Callable[[str], SyncRegistry]) -> None:
    writer = registry("inflight-b")
    inflight.save(writer, Inflight(5, prompts=[1], next_batch=6))
    writer.close()  # the gang restarts: its leases are revoked, the record (lease-free) stays
    reader = registry("inflight-b")
    assert inflight.load(reader, 5) == Inflight(5, [1], 6)
    assert inflight.load(registry("inflight-other"), 5) is None


def test_a_new_job_of_the_same_name_does_not_read_the_old_ones(etcd_server: Any) -> None:
    """Records live under the job's uid: a job re-created under the same name starts afresh."""
    old = SyncRegistry(etcd_server.endpoint, "test", "inflight-c", "pod0", "trainer", uid="uid-1").connect()
    new = SyncRegistry(etcd_server.endpoint, "test", "inflight-c", "pod0", "trainer", uid="uid-2").connect()
    try:
        inflight.save(old, Inflight(7, prompts=[3], next_batch=None))
        assert inflight.load(new, 7) is None
        assert inflight.load(old, 7) == Inflight(7, [3], None)
    finally:
        old.close()
        new.close()
