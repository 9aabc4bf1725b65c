"""Recycled version slots: a steady-state publish writes into the files (and so the /dev/shm pages)
of a version the GC released, bit-exact, and never into a version a reader pins.

Real etcd, real /dev/shm. "Pages reused" is checked without timing: the new version's shard files
are the released version's inodes, which had all their blocks allocated before the write.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.versions import layout, slots, version_writer

pytestmark = pytest.mark.etcd


def tensors(v: int, n: int = 6, side: int = 64) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(v)
    return [(f"layer{i}.weight", torch.randn(side, side, generator=g)) for i in range(n)]


def inodes(root: Path, job: str, v: int) -> dict[str, int]:
    d = layout.version_dir(root, job, v)
    return {f.name: f.stat().st_ino for f in sorted(d.glob("shard-*.bin"))}


def assert_exact(root: Path, job: str, v: int, source: list[tuple[str, torch.Tensor]]) -> None:
    mapped = layout.MappedVersion(layout.version_dir(root, job, v))
    mapped.verify_checksums()
    got = dict(mapped.tensors())
    assert list(got) == [n for n, _ in source]
    for name, t in source:
        assert torch.equal(got[name], t), name


def test_steady_publish_writes_into_released_pages(make_registry: Any, shm_root: Path, job: str) -> None:
    pub = Publisher(shm_root, job, make_registry(), keep=1, shard_bytes=40_000)  # 6 x 16 KiB: 3 shards
    r1 = pub.publish(None, tensors(1))
    first = inodes(shm_root, job, 1)
    assert len(first) == 3 and r1.recycled_bytes == 0
    r2 = pub.publish(None, tensors(2))
    assert r2.collected == [1] and r2.recycled_bytes == 0  # v1 was still the latest while v2 was written
    spare = pub.spares
    held = {f.stat().st_ino: f for f in spare.iterdir()}
    assert set(held) == set(first.values()), "the released version's files are kept as spares"
    for f in held.values():  # their pages exist: every block of the file is allocated
        assert f.stat().st_blocks * 512 >= f.stat().st_size
    r3 = pub.publish(None, tensors(3))
    assert r3.recycled_bytes == r3.bytes and r3.collected == [2]
    assert set(inodes(shm_root, job, 3).values()) == set(first.values()), "v3 lives in v1's slot files"
    assert_exact(shm_root, job, 3, tensors(3))
    # the checksums are those of a fresh write of the same tensors
    fresh = version_writer.write_version(shm_root / "fresh", job, 3, tensors(3), shard_bytes=40_000)
    recycled = layout.read_index(layout.version_dir(shm_root, job, 3))
    assert [t.checksum for t in recycled.tensors] == [t.checksum for t in fresh.index.tensors]
    assert slots.held(spare) == r3.bytes  # one slot between publishes, v2's files
    # a version of another shape: grown and shrunk tensors still come out exact, files cut to size
    for v, n, side in ((4, 9, 80), (5, 2, 32), (6, 6, 64)):
        pub.publish(v, tensors(v, n, side))
        assert_exact(shm_root, job, v, tensors(v, n, side))
    assert layout.list_versions(shm_root, job) == [6] and pub.registry.versions() == [6]


def test_pinned_version_is_never_recycled(make_registry: Any, shm_root: Path, job: str) -> None:
    pub = Publisher(shm_root, job, make_registry(), keep=1, shard_bytes=40_000)
    reader = make_registry("pod0", "rollout")
    pub.publish(1, tensors(1))
    reader.pin(1)
    mapped = layout.MappedVersion(layout.version_dir(shm_root, job, 1))  # a reader maps v1 under its pin
    pinned = inodes(shm_root, job, 1)
    written: set[int] = set()
    for v in (2, 3, 4, 5):
        r = pub.publish(v, tensors(v))
        assert 1 not in r.collected
        written |= set(inodes(shm_root, job, v).values())
    assert r.recycled_bytes == r.bytes, "later versions do recycle (each other's slots)"
    assert not written & set(pinned.values()), "a pinned version's files were reused"
    mapped.verify_checksums()
    for name, t in tensors(1):
        assert torch.equal(mapped.tensor(next(x for x in mapped.index.tensors if x.name == name)), t)
    reader.unpin(1)
    v5 = set(inodes(shm_root, job, 5).values())
    r = pub.publish(6, tensors(6))
    assert r.collected == [1, 5]  # released at once; one slot's worth of their files stays spare
    r = pub.publish(7, tensors(7))
    assert r.recycled_bytes == r.bytes and set(inodes(shm_root, job, 7).values()) <= v5 | set(pinned.values())
    assert_exact(shm_root, job, 7, tensors(7))


def test_recycle_off_deletes_released_versions(make_registry: Any, shm_root: Path, job: str) -> None:
    pub = Publisher(shm_root, job, make_registry(), keep=1, recycle=False)
    for v in (1, 2, 3):
        r = pub.publish(v, tensors(v))
    assert r.recycled_bytes == 0 and not pub.spares.exists()
    assert os.listdir(layout.job_dir(shm_root, job)) == [layout.version_dir(shm_root, job, 3).name]


def test_a_version_another_pod_is_pulling_is_deleted_not_recycled(
    make_registry: Any, shm_root: Path, job: str
) -> None:
    pub = Publisher(shm_root, job, make_registry(), keep=1)
    receiver = make_registry("pod1", "rollout")
    pub.publish(1, tensors(1))
    # pod1 is pulling v1 from this pod's holder server (which has the shard files open)
    receiver.put_json(keys.receiving(receiver.namespace, receiver.scope, 1, "pod1"), {"since": 0}, lease=True)
    assert pub.publish(2, tensors(2)).collected == [1]
    assert slots.held(pub.spares) == 0, "a version being pulled went to the spare pool"
    assert pub.publish(3, tensors(3)).recycled_bytes == 0
