"""etcd registry against a real etcd: one-transaction registration, pins vs GC, leases, watch."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.versions import version_writer

pytestmark = pytest.mark.etcd


def write(shm_root: Path, job: str, v: int) -> version_writer.WriteReport:
    return version_writer.write_version(
        shm_root, job, v, [("w", torch.full((4, 4), float(v))), ("b", torch.zeros(3))], shard_bytes=64
    )


def test_register_is_one_transaction(make_registry: Any, shm_root: Path, job: str) -> None:
    reg = make_registry()
    rep = write(shm_root, job, 1)
    reg.register(rep.index, str(rep.path))
    assert reg.latest() == 1 and reg.versions() == [1]
    rec = reg.version_record(1)
    assert rec["shards"] == len(rep.index.shards) == 2 and rec["dir"] == str(rep.path)
    assert [s["digest"] for s in reg.shard_records(1)] == [s.digest for s in rep.index.shards]

    async def revisions() -> set[int]:
        rng = await reg.reg.etcd.call("list", lambda c: c.get_prefix(keys.job_prefix("test", job).encode()))
        return {kv.mod_revision for kv in rng if b"/engines/" not in kv.key}

    assert len(reg._run(revisions())) == 1, "shards, version, latest and holder must share one revision"
    with pytest.raises(errors.VersionExists):
        reg.register(rep.index, str(rep.path))


def test_pin_holds_a_version_against_gc(make_registry: Any, shm_root: Path, job: str) -> None:
    writer, reader = make_registry(), make_registry("pod1", "rollout")
    for v in (1, 2, 3):
        rep = write(shm_root, job, v)
        writer.register(rep.index, str(rep.path))
    reader.pin(1)
    assert reader.readers(1) == ["pod1.rollout"]
    assert writer.gc(keep=1) == [2], "pinned version 1 must survive, 2 goes, newest (3) is kept"
    assert writer.versions() == [1, 3] and writer.shard_records(2) == []
    reader.unpin(1)
    assert writer.gc(keep=1) == [1]
    with pytest.raises(errors.VersionNotFound):
        reader.pin(1)
    with pytest.raises(errors.VersionNotFound):
        reader.version_record(2)


def test_versions_vanish_with_the_writers_lease(make_registry: Any, shm_root: Path, job: str) -> None:
    writer, other = make_registry(ttl=2), make_registry("pod1", "rollout")
    rep = write(shm_root, job, 1)
    writer.register(rep.index, str(rep.path))
    time.sleep(3)  # keepalive holds the lease beyond its TTL
    assert other.latest() == 1
    writer.close(revoke=False)  # the writer "dies": no more keepalives
    deadline = time.monotonic() + 10
    while other.latest() is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert other.latest() is None and other.versions() == [] and other.shard_records(1) == []


def test_wait_latest_sees_a_new_version(make_registry: Any, shm_root: Path, job: str) -> None:
    writer, reader = make_registry(), make_registry("pod1", "rollout")
    rep = write(shm_root, job, 1)
    writer.register(rep.index, str(rep.path))
    got: list[int | None] = []
    t = threading.Thread(target=lambda: got.append(reader.wait_latest(newer_than=1, timeout=10)))
    t.start()
    time.sleep(0.5)
    rep = write(shm_root, job, 2)
    writer.register(rep.index, str(rep.path))
    t.join(15)
    assert got == [2]
    assert reader.wait_latest(newer_than=2, timeout=0.5) is None


def test_status_and_ops_records(make_registry: Any) -> None:
    reg = make_registry("pod7", "rollout")
    reg.put_status({"phase": "ready", "version": 3})
    reg.put_op("op1", {"op": "update", "state": "done"})
    assert reg.get_status("pod7", "rollout") == {"phase": "ready", "version": 3}
    assert reg.get_op("op1") == {"op": "update", "state": "done"}


def test_a_restarted_gang_ignores_the_old_generations_rollouts(make_registry: Any) -> None:
    """A killed pod's rollout record outlives it by its lease TTL, under the key its successor uses.

    The driver (`trainer.resume`) must wait for the new generation's rollout, not call the dead one."""
    from tandem.sidecars.trainer.loop.recovery import resume

    old, new, driver = make_registry("job-0", "rollout", ttl=30), make_registry("job-1", "rollout"), make_registry()
    key = keys.endpoint("test", driver.scope, "job-0", "rollout")
    old.put_json(key, {"address": "10.0.0.1:8000", "ready": True, "pod": "job-0", "generation": 0}, lease=True)
    new.put_json(keys.endpoint("test", driver.scope, "job-1", "rollout"),
                 {"address": "10.0.0.2:8000", "ready": True, "pod": "job-1", "generation": 1}, lease=True)
    assert resume.rollout_addresses(driver, 0) == ["10.0.0.1:8000"]
    assert resume.rollout_addresses(driver, 1) == ["10.0.0.2:8000"]
    with pytest.raises(resume.ResumeError, match="only 1 of 2 rollout sidecars"):
        resume.wait_for_rollouts(driver, 2, generation=1, timeout=1)
    new.put_json(key, {"address": "10.0.0.3:8000", "ready": True, "pod": "job-0", "generation": 1}, lease=True)
    assert resume.wait_for_rollouts(driver, 2, generation=1, timeout=5) == ["10.0.0.3:8000", "10.0.0.2:8000"]


def test_connect_waits_for_an_etcd_that_is_not_answering_yet(etcd_server: Any, job: str) -> None:
    """A sidecar may start while etcd is still starting (or too busy to accept): connect() keeps
    trying until etcd answers instead of failing the sidecar on the first dial."""
    from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry

    outcome: list[object] = []

    def connect() -> None:
        try:
            outcome.append(SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "rollout", timeout=2.0)
                           .connect(wait_s=120.0))
        except Exception as e:  # reported below
            outcome.append(e)

    etcd_server.stop()
    thread = threading.Thread(target=connect, daemon=True)
    try:
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive() and not outcome, "connect() must not succeed or give up while etcd is down"
    finally:
        etcd_server.start()
    thread.join(timeout=150)
    assert len(outcome) == 1 and isinstance(outcome[0], SyncRegistry), outcome
    reg = outcome[0]
    reg.put_json(f"/tandem/test/{job}/probe", {"ok": True})
    assert reg.get_json(f"/tandem/test/{job}/probe") == {"ok": True}
    reg.close()


def test_a_lease_etcd_no_longer_knows_is_replaced_on_register(make_registry: Any, shm_root: Path, job: str) -> None:
    """The lease expired in etcd while its keepalives went unanswered (a loaded machine): the next
    registration gets a new lease and succeeds, instead of failing on "requested lease not found"."""
    writer, other = make_registry(), make_registry("pod1", "rollout")
    rep = write(shm_root, job, 1)
    writer.register(rep.index, str(rep.path))
    dead = writer.reg._lease.id
    writer._run(writer.reg.etcd.call("revoke", lambda c: c.revoke_lease(dead)))  # gone, as an expiry leaves it
    assert other.latest() is None  # the keys bound to it went with it
    rep2 = write(shm_root, job, 2)
    writer.register(rep2.index, str(rep2.path))
    assert other.latest() == 2 and writer.reg._lease.id != dead


@pytest.mark.parametrize("path", ["holder", "status", "op", "endpoint", "pin"])
def test_every_lease_bound_write_survives_a_forgotten_lease(make_registry: Any, shm_root: Path, job: str,
                                                            path: str) -> None:
    """The same expiry on the other lease-bound paths (a holder announcing a version it pulled, an engine's
    status and operations, a rollout's endpoint, a reader's pin): each writes under a new lease instead of
    ending the job with "requested lease not found"."""
    writer, pod = make_registry(), make_registry("pod1", "rollout")
    rep = write(shm_root, job, 1)
    writer.register(rep.index, str(rep.path))
    pod.put_status({"phase": "ready"})  # the pod's lease exists, then etcd forgets it
    dead = pod.reg._lease.id
    pod._run(pod.reg.etcd.call("revoke", lambda c: c.revoke_lease(dead)))
    key = f"/tandem/test/{job}/endpoint"
    writes = {"holder": lambda: pod.add_holder(1, str(rep.path)), "status": lambda: pod.put_status({"phase": "ready"}),
              "op": lambda: pod.put_op("1-update-x", {"op": "update"}),
              "endpoint": lambda: pod.put_json(key, {"a": 1}, lease=True), "pin": lambda: pod.pin(1)}
    writes[path]()
    assert pod.reg._lease.id != dead
    if path == "holder":
        assert writer.holders(1)[-1] == "pod1"
    elif path == "endpoint":
        assert writer.get_json(key) == {"a": 1}
    elif path == "pin":
        assert writer.readers(1)
