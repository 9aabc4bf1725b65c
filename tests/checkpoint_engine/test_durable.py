"""Durable copies (checkpoint_engine.versions.durable) and the trainer's background persister, on real files
and etcd."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.versions import layout, version_writer
from tandem.checkpoint_engine.versions.durable import META, DurableStore
from tandem.sidecars.trainer.loop.recovery.persist import Persister


def tensors(v: int) -> list[tuple[str, torch.Tensor]]:
    return [(f"layer{i}.weight", torch.full((32, 48), float(v + i))) for i in range(3)]


def written(shm_root: Path, job: str, v: int) -> Path:
    return version_writer.write_version(shm_root, job, v, tensors(v), shard_bytes=10_000).path


def test_save_copies_a_whole_version_that_loads_back(shm_root: Path, job: str, tmp_path: Path) -> None:
    store = DurableStore(tmp_path, "ns", job, "uid-1", keep=2)
    src = written(shm_root, job, 3)
    saved = store.save(src, 3, iteration=7)
    assert saved.path == tmp_path / "ns" / job / "uid-1" / "v000000000003"
    assert sorted(p.name for p in saved.path.iterdir()) == sorted(
        [layout.INDEX, META] + [p.name for p in src.glob("shard-*")])
    got = store.latest()
    assert got is not None and (got.version, got.iteration) == (3, 7)
    loaded = dict(layout.MappedVersion(got.path).tensors())
    for name, t in tensors(3):
        assert torch.equal(loaded[name], t)
    assert not [p for p in store.directory.iterdir() if p.name.startswith(".tmp-")]


def test_keeps_the_newest_and_skips_damaged_copies(shm_root: Path, job: str, tmp_path: Path) -> None:
    store = DurableStore(tmp_path, "ns", job, "u", keep=2)
    for v in (1, 2, 3, 4):
        store.save(written(shm_root, job, v), v, iteration=v * 10)
    assert store.versions() == [3, 4]
    # one flipped byte in the newest copy: latest() falls back to the previous whole version
    shard = sorted((store.directory / "v000000000004").glob("shard-*"))[0]
    data = bytearray(shard.read_bytes())
    data[5] ^= 0xFF
    shard.write_bytes(bytes(data))
    got = store.latest()
    assert got is not None and (got.version, got.iteration) == (3, 30)
    with pytest.raises(errors.ChecksumMismatch):
        store.read(4)
    # a copy without its metadata (written by hand, or torn by a crash between files) is not trusted
    os.unlink(store.directory / "v000000000003" / META)
    assert store.latest() is None


def test_other_uids_and_wrong_metadata_are_never_resumed(shm_root: Path, job: str, tmp_path: Path) -> None:
    old = DurableStore(tmp_path, "ns", job, "old-uid")
    old.save(written(shm_root, job, 9), 9, iteration=90)
    new = DurableStore(tmp_path, "ns", job, "new-uid")
    assert new.latest() is None  # same job name, another RLHFJob object: start fresh
    new.save(written(shm_root, job, 1), 1, iteration=1)
    meta = new.directory / "v000000000001" / META
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "uid": "old-uid"}))
    with pytest.raises(errors.InvalidVersion, match="uid"):
        new.read(1)
    assert old.versions() == [9]  # untouched by the other store's GC


def test_save_refuses_a_mismatched_source_and_leaves_no_temp(shm_root: Path, job: str, tmp_path: Path) -> None:
    store = DurableStore(tmp_path, "ns", job, "u")
    src = written(shm_root, job, 2)
    with pytest.raises(errors.InvalidVersion, match="holds version 2"):
        store.save(src, 5, iteration=5)
    (src / "shard-00000.bin").unlink()
    with pytest.raises(FileNotFoundError):
        store.save(src, 2, iteration=2)
    assert store.versions() == []
    assert not [p for p in store.directory.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.etcd
def test_training_state_files_are_whole_and_go_with_their_copies(shm_root: Path, job: str, tmp_path: Path) -> None:
    """Per-rank training state: written by one rename, removed once older than every kept copy."""
    store = DurableStore(tmp_path, "ns", job, "u", keep=2)
    path = store.write_train_file(1, "rank-00000.pt", lambda p: p.write_bytes(b"state 1"))
    assert path == store.directory / "train" / "v000000000001" / "rank-00000.pt" and path.read_bytes() == b"state 1"

    def torn(p: Path) -> None:
        p.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store.write_train_file(1, "rank-00000.pt", torn)
    assert path.read_bytes() == b"state 1"  # the old file stands, whole; no temp file is left
    assert [p.name for p in store.train_dir(1).iterdir()] == ["rank-00000.pt"]
    for v in (1, 2, 3):
        store.write_train_file(v, "rank-00001.pt", lambda p: p.write_bytes(b"x"))
        store.save(written(shm_root, job, v), v, iteration=v)
    store.write_train_file(4, "rank-00000.pt", lambda p: p.write_bytes(b"x"))  # its weights still on the way
    store.gc()
    assert store.versions() == [2, 3] and store.train_versions() == [2, 3, 4]
    assert store.versions() == layout.list_versions(store.base, "u")  # "train" is not taken for a version


def test_persister_copies_due_versions_in_the_background(
    make_registry: Any, shm_root: Path, job: str, tmp_path: Path
) -> None:
    reg = make_registry()
    pub = Publisher(shm_root, job, reg, keep=1)  # GC deletes each older version from shm at once
    store = DurableStore(tmp_path, "test", job, "u", keep=3)
    persister = Persister(store, reg, shm_root, job, every=2, iterations=5)
    pub.publish(1, tensors(1))
    rows = []
    for it in range(5):  # iteration it publishes version it + 2; copies due after 2, 4 and 5 iterations
        version = pub.publish(it + 2, tensors(it + 2)).version
        rows.append(persister.after_publish(it, version))
    persister.close()
    assert [bool(r) for r in rows] == [False, True, False, True, True]
    assert rows[3]["persisted_version"] == 3 and rows[3]["persist_s"] > 0
    assert store.versions() == [3, 5, 6]
    assert [store.read(v).iteration for v in store.versions()] == [2, 4, 5]
    for v in store.versions():  # byte-exact copies of what was published, though shm GC ran meanwhile
        got = dict(layout.MappedVersion(store.read(v).path).tensors())
        assert all(torch.equal(got[n], t) for n, t in tensors(v))
    assert all(reg.readers(v) == [] for v in (3, 5, 6))  # pins released
    pub.gc()  # with the pins gone, shm keeps only the newest
    assert layout.list_versions(shm_root, job) == [6]
    assert persister.failures == 0
