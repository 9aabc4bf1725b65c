"""Publisher against real etcd and real shared memory: GC, kill -9 mid-publish, etcd restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.versions import layout

pytestmark = pytest.mark.etcd
ROOTS = [str(Path(__file__).resolve().parents[2] / "checkpoint_engine")]


def tensors(v: int, n: int = 4) -> list[tuple[str, torch.Tensor]]:
    return [(f"layer{i}.weight", torch.full((64, 64), float(v))) for i in range(n)]


def test_publish_registers_and_collects(make_registry: Any, shm_root: Path, job: str) -> None:
    pub = Publisher(shm_root, job, make_registry(), keep=2, shard_bytes=40_000)
    reports = [pub.publish(None, tensors(v)) for v in (1, 2, 3, 4)]
    assert [r.version for r in reports] == [1, 2, 3, 4]
    assert reports[0].shards == 2 and reports[0].bytes == 4 * 64 * 64 * 4
    assert reports[3].collected == [2] and reports[2].collected == [1]
    assert pub.registry.versions() == [3, 4] and layout.list_versions(shm_root, job) == [3, 4]
    with pytest.raises(errors.VersionExists):
        pub.publish(2, tensors(2))
    assert pub.status().version == 4


def test_records_lost_with_the_lease_never_send_versions_back(make_registry: Any, shm_root: Path, job: str) -> None:
    """The trainer's lease expires (etcd unreachable past its TTL, a keepalive starved on a loaded machine): its
    versions' records go with it, the versions stay in shm. The next publish counts on from what was written,
    not from the empty registry (which said 1 and collided with the version 1 in shm: VersionExists)."""
    pub = Publisher(shm_root, job, make_registry(), keep=3)
    assert [pub.publish(None, tensors(v)).version for v in (1, 2)] == [1, 2]
    pub.registry.close(revoke=True)  # the lease gone: etcd deletes every record it carried
    pub.registry = make_registry()
    assert pub.registry.versions() == [] and layout.list_versions(shm_root, job) == [1, 2]
    assert pub.publish(None, tensors(3)).version == 3  # this publisher's own count
    pub.registry.close(revoke=True)
    fresh = Publisher(shm_root, job, make_registry("pod0", "trainer4"), keep=3)  # a new publisher: only shm knows
    assert fresh.registry.versions() == [] and layout.list_versions(shm_root, job) == [1, 2, 3]
    assert fresh.publish(None, tensors(4)).version == 4


WRITER = textwrap.dedent("""
    import sys, time, torch
    sys.path[:0] = {roots!r}
    from pathlib import Path
    from tandem.checkpoint_engine.service.publisher import Publisher
    from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
    reg = SyncRegistry({endpoint!r}, "test", {job!r}, "pod0", "trainer2", ttl=5).connect()
    pub = Publisher(Path({root!r}), {job!r}, reg)
    def slow():
        for i in range(1000):
            if i == 3:
                print("midway", flush=True)
            if i >= 3:
                time.sleep(0.05)
            yield f"t{{i}}", torch.full((256, 256), 7.0)
    pub.publish(2, slow())
""")


def test_kill_9_mid_publish_is_invisible_and_cleaned(
    make_registry: Any, etcd_server: Any, shm_root: Path, job: str
) -> None:
    pub = Publisher(shm_root, job, make_registry(), keep=2)
    pub.publish(1, tensors(1))
    code = WRITER.format(roots=ROOTS, endpoint=etcd_server.endpoint, job=job, root=str(shm_root))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"midway"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reader = make_registry("pod1", "rollout")
    assert reader.latest() == 1 and reader.versions() == [1]
    with pytest.raises(errors.VersionNotFound):
        reader.version_record(2)
    temps = [p.name for p in (shm_root / job).iterdir() if p.name.startswith(".tmp-")]
    assert len(temps) == 1 and layout.list_versions(shm_root, job) == [1]
    fresh = Publisher(shm_root, job, make_registry("pod0", "trainer3"))
    assert fresh.recover()["stale_temps"] == temps
    assert not [p for p in (shm_root / job).iterdir() if p.name.startswith(".tmp-")]
    assert fresh.publish(None, tensors(2)).version == 2


def test_etcd_down_during_publish_fails_cleanly_then_retry(
    make_registry: Any, etcd_server: Any, shm_root: Path, job: str
) -> None:
    pub = Publisher(shm_root, job, make_registry(), keep=3)
    pub.publish(1, tensors(1))

    def stop_midway() -> Any:
        for i, item in enumerate(tensors(2)):
            if i == 2:
                etcd_server.stop()
            yield item

    try:
        with pytest.raises(errors.RegistryUnavailable):
            pub.publish(2, stop_midway())
        assert layout.list_versions(shm_root, job) == [1], "an unregistered version's files are removed"
    finally:
        etcd_server.start()
    deadline = time.monotonic() + 15
    while True:
        try:
            assert pub.publish(2, tensors(2)).version == 2
            break
        except errors.RegistryUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert pub.registry.versions() == [1, 2]
