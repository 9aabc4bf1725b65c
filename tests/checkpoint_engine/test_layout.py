"""Shared-memory layout: round trip, alignment, shards, zero-copy views, torn and corrupt versions."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import layout, version_writer


def sample() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(3, 5, generator=g)),
        ("b.bf16", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("c.scalar", torch.tensor(3, dtype=torch.int64)),
        ("d.transposed", torch.randn(4, 6, generator=g).t()),  # non-contiguous input
        ("e.half", torch.randn(2, 3, 3, generator=g).half()),
    ]


def test_round_trip_alignment_and_shards(shm_root: Path) -> None:
    rep = version_writer.write_version(shm_root, "j", 1, sample(), shard_bytes=128)
    idx = layout.read_index(rep.path)
    assert len(idx.shards) > 1, "a 128-byte shard limit must split these tensors"
    assert all(t.offset % layout.ALIGN == 0 for t in idx.tensors)
    for s in idx.shards:
        assert (rep.path / s.file).stat().st_size == s.nbytes
    mapped = layout.MappedVersion(rep.path)
    mapped.verify_checksums()
    got = dict(mapped.tensors())
    for name, t in sample():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    assert layout.list_versions(shm_root, "j") == [1]


def test_views_map_the_file_without_copy(shm_root: Path) -> None:
    rep = version_writer.write_version(shm_root, "j", 1, [("x", torch.zeros(16)), ("y", torch.zeros(16))])
    mapped = layout.MappedVersion(rep.path)
    x, y = (mapped.tensor(r) for r in mapped.index.tensors)
    assert y.data_ptr() - x.data_ptr() == mapped.index.tensors[1].offset
    with open(rep.path / "shard-00000.bin", "r+b") as f:  # a write to the file shows in the view
        f.seek(mapped.index.tensors[1].offset)
        f.write(torch.tensor([5.0]).numpy().tobytes())
    assert float(y[0]) == 5.0


def test_corrupt_byte_is_detected(shm_root: Path) -> None:
    rep = version_writer.write_version(shm_root, "j", 1, sample())
    rec = rep.index.tensors[0]
    with open(rep.path / rep.index.shards[rec.shard].file, "r+b") as f:
        f.seek(rec.offset + 5)
        b = f.read(1)
        f.seek(rec.offset + 5)
        f.write(bytes([b[0] ^ 0x01]))
    with pytest.raises(errors.ChecksumMismatch, match="a.weight"):
        layout.MappedVersion(rep.path).verify_checksums()


def test_truncated_or_missing_files_are_torn(shm_root: Path) -> None:
    rep = version_writer.write_version(shm_root, "j", 1, sample())
    shard = rep.path / rep.index.shards[0].file
    os.truncate(shard, shard.stat().st_size - 64)
    with pytest.raises(errors.TornVersion, match="bytes"):
        layout.MappedVersion(rep.path)
    shard.unlink()
    with pytest.raises(errors.TornVersion, match="missing"):
        layout.MappedVersion(rep.path)
    (rep.path / layout.INDEX).write_text("{not json")
    with pytest.raises(errors.TornVersion, match="unreadable"):
        layout.read_index(rep.path)


def test_validate_names_shapes_dtypes(shm_root: Path) -> None:
    rep = version_writer.write_version(shm_root, "j", 1, sample())
    expected = {n: layout.Expected(tuple(t.shape), layout.dtype_name(t.dtype)) for n, t in sample()}
    layout.validate(rep.index, expected)
    bad = dict(expected)
    bad["a.weight"] = layout.Expected((5, 3), "float32")
    bad["b.bf16"] = layout.Expected((7,), "float32")
    bad["z.missing"] = layout.Expected((1,), "float32")
    del bad["e.half"]
    with pytest.raises(errors.InvalidVersion) as e:
        layout.validate(rep.index, bad)
    msg = str(e.value)
    for part in (
        "a.weight: shape",
        "b.bf16: dtype",
        "missing tensors ['z.missing']",
        "unexpected tensors ['e.half']",
    ):
        assert part in msg
    layout.validate(rep.index, {**expected, "z.missing": layout.Expected((1,), "float32")}, optional={"z.missing"})


def test_existing_version_and_duplicate_names_rejected(shm_root: Path) -> None:
    version_writer.write_version(shm_root, "j", 1, sample())
    with pytest.raises(errors.VersionExists):
        version_writer.write_version(shm_root, "j", 1, sample())
    with pytest.raises(ValueError, match="twice"):
        version_writer.write_version(shm_root, "j", 2, [("x", torch.zeros(1)), ("x", torch.zeros(1))])
    assert layout.list_versions(shm_root, "j") == [1]
    assert not [p for p in (shm_root / "j").iterdir() if p.name.startswith(".tmp-")], "failed write left a temp dir"


def test_stale_temp_dirs_removed_only_when_their_writer_is_gone(shm_root: Path) -> None:
    jdir = shm_root / "j"
    live, dead = jdir / ".tmp-v000000000007-live", jdir / ".tmp-v000000000008-dead"
    for d in (live, dead):
        d.mkdir(parents=True)
        (d / "shard-00000.bin").write_bytes(b"x" * 100)
        (d / ".lock").touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time; fd=os.open(sys.argv[1],os.O_RDWR); "
            "fcntl.flock(fd,fcntl.LOCK_EX); print('locked',flush=True); time.sleep(60)",
            str(live / ".lock"),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        assert layout.clean_stale_temps(shm_root, "j") == [dead.name]
        assert live.exists() and not dead.exists()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.05)
    fd = os.open(live / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again once the holder died
    os.close(fd)
    assert layout.clean_stale_temps(shm_root, "j") == [live.name]
