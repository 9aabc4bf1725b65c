"""Versioned, aligned shared-memory layout of a job's weights: write once, map without a copy.

Here: the format (the index's records, the paths, the constants), reading and mapping a version (`read_index`,
`MappedVersion`), checking it against what an engine expects (`validate`) and removing versions; writing one is
`version_writer.write_version`. Callers: the publisher writes versions (through `version_writer`), the rollout
engine (tandem.sidecars.rollout_engine) and its worker side (`rollout_engine.worker.shm_loader`) read them
(`read_index`, `MappedVersion`), the publisher's GC removes them (`remove_version`, `clean_stale_temps`).
Transports (other pods) copy shard files byte for byte.

On disk (normally under /dev/shm):

    <root>/<job>/v<v:012d>/index.json          tensor index (written last, inside the temp dir)
    <root>/<job>/v<v:012d>/shard-<i:05d>.bin   flat shard files, tensors 64-byte aligned
    <root>/<job>/.tmp-v<v:012d>-<uuid>/        a version being written; `.lock` is flock'ed by the
                                               writer, so a dead writer's temp dir is detectable
    <root>/<job>/.spare/*.bin                  shard files of released versions, overwritten in place
                                               as the next version's shards (slots.py)

A version directory appears by one atomic rename of a complete temp directory, so a reader never
sees a half-written version; a writer killed mid-write leaves only a `.tmp-*` directory, removed by
`clean_stale_temps` once its flock is free. Every tensor carries an xxh3-64 checksum (blake3 when
xxhash is missing): see bench/weight_sync.py for the measured speeds.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import hashing

FORMAT = "tandem-shm-v1"
ALIGN = 64
DEFAULT_SHARD_BYTES = 1 << 30
INDEX = "index.json"
STALE_UNLOCKED_S = 30.0


class TensorRecord(BaseModel):
    name: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    shape: list[int]
    shard: int
    offset: int
    nbytes: int
    checksum: str


class ShardRecord(BaseModel):
    index: int
    file: str
    nbytes: int
    digest: str  # checksum over the shard's tensor checksums, in order (cheap, order-sensitive)


class VersionIndex(BaseModel):
    format: str = FORMAT
    job: str
    version: int
    algorithm: str
    align: int = ALIGN
    created: float
    shards: list[ShardRecord]
    tensors: list[TensorRecord]
    adapter: dict[str, Any] | None = None  # LoRA: the PEFT adapter config; the tensors are adapters only

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.shards)


def job_dir(root: Path, job: str) -> Path:
    return Path(root) / job


def version_dir(root: Path, job: str, version: int) -> Path:
    return job_dir(root, job) / f"v{version:012d}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise errors.InvalidVersion(f"unknown dtype {name!r} in tensor index")
    return dt


def read_index(path: Path) -> VersionIndex:
    """Parse a version directory's index; a missing or unreadable index means a torn version."""
    try:
        return VersionIndex.model_validate_json((Path(path) / INDEX).read_bytes())
    except FileNotFoundError as e:
        raise errors.TornVersion(f"no index in {path}") from e
    except ValueError as e:
        raise errors.TornVersion(f"unreadable index in {path}: {e}") from e


def checked_shard_size(f: Path, nbytes: int) -> int:
    """The size of shard file `f`, which must be the `nbytes` its index says (else TornVersion)."""
    try:
        size = f.stat().st_size
    except FileNotFoundError as e:
        raise errors.TornVersion(f"shard file {f} is missing") from e
    if size != nbytes:
        raise errors.TornVersion(f"shard file {f} has {size} bytes, index says {nbytes}")
    return size


class MappedVersion:
    """A version's shard files mapped (MAP_SHARED, no copy) with per-tensor views; readers must
    not write into the views (checksums would expose it to the next reader)."""

    def __init__(self, path: Path, index: VersionIndex | None = None) -> None:
        self.path = Path(path)
        self.index = index if index is not None else read_index(self.path)
        self._buffers: dict[int, torch.Tensor] = {}
        self._maps: list[mmap.mmap] = []
        for s in self.index.shards:
            f = self.path / s.file
            size = checked_shard_size(f, s.nbytes)
            self._buffers[s.index] = self._map(f, size) if size else torch.empty(0, dtype=torch.uint8)

    def _map(self, f: Path, size: int) -> torch.Tensor:
        """Map a shard MAP_SHARED (no copy) with MAP_POPULATE, so the page tables are filled in one
        call instead of one fault per page (measured: faults otherwise halve the copy speed)."""
        fd = os.open(f, os.O_RDWR)
        try:
            mm = mmap.mmap(
                fd,
                size,
                flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
        finally:
            os.close(fd)
        self._maps.append(mm)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(mm, dtype=torch.uint8)

    def raw(self, rec: TensorRecord) -> torch.Tensor:
        buf = self._buffers.get(rec.shard)
        if buf is None or rec.offset + rec.nbytes > buf.numel() or rec.offset % ALIGN:
            raise errors.TornVersion(f"tensor {rec.name} lies outside its shard {rec.shard}")
        return buf[rec.offset : rec.offset + rec.nbytes]

    def tensor(self, rec: TensorRecord) -> torch.Tensor:
        return self.raw(rec).view(torch_dtype(rec.dtype)).view(rec.shape)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for rec in self.index.tensors:
            yield rec.name, self.tensor(rec)

    def verify_checksums(self) -> None:
        """Recompute every tensor's checksum from the mapped bytes; raise on the first mismatch."""
        if self.index.algorithm != hashing.ALGORITHM and self.index.algorithm not in hashing.SUPPORTED:
            raise errors.InvalidVersion(f"unknown checksum algorithm {self.index.algorithm!r}")
        for rec in self.index.tensors:
            got = hashing.checksum(self.raw(rec).numpy(), self.index.algorithm)
            if got != rec.checksum:
                raise errors.ChecksumMismatch(
                    f"version {self.index.version}: tensor {rec.name} (shard {rec.shard}, offset "
                    f"{rec.offset}) has checksum {got}, index says {rec.checksum}"
                )


@dataclass(frozen=True)
class Expected:
    shape: tuple[int, ...]
    dtype: str


def validate(index: VersionIndex, expected: Mapping[str, Expected], optional: Iterable[str] = ()) -> None:
    """Check names, shapes and dtypes of `index` against what the engine expects.

    Names in `optional` may be absent (e.g. lm_head.weight of a model with tied embeddings).
    Raises InvalidVersion listing every problem; checksums are checked by MappedVersion.
    """
    problems: list[str] = []
    have = {t.name: t for t in index.tensors}
    opt = set(optional)
    missing = sorted(set(expected) - set(have) - opt)
    extra = sorted(set(have) - set(expected))
    if missing:
        problems.append(f"missing tensors {missing[:8]}{' …' if len(missing) > 8 else ''}")
    if extra:
        problems.append(f"unexpected tensors {extra[:8]}{' …' if len(extra) > 8 else ''}")
    for name, rec in have.items():
        exp = expected.get(name)
        if exp is None:
            continue
        if tuple(rec.shape) != exp.shape:
            problems.append(f"{name}: shape {tuple(rec.shape)} != expected {exp.shape}")
        if rec.dtype != exp.dtype:
            problems.append(f"{name}: dtype {rec.dtype} != expected {exp.dtype}")
        elem = torch_dtype(rec.dtype).itemsize
        numel = 1
        for d in rec.shape:
            numel *= d
        if numel * elem != rec.nbytes:
            problems.append(f"{name}: {rec.nbytes} bytes do not hold shape {rec.shape} of {rec.dtype}")
    if problems:
        raise errors.InvalidVersion(f"version {index.version} does not fit the engine: " + "; ".join(problems))


def list_versions(root: Path, job: str) -> list[int]:
    """Complete version directories of `job` present on this machine, ascending."""
    jdir = job_dir(root, job)
    if not jdir.is_dir():
        return []
    out = []
    for p in jdir.iterdir():
        if p.name.startswith("v") and p.name[1:].isdigit() and p.is_dir():
            out.append(int(p.name[1:]))
    return sorted(out)


def remove_version(root: Path, job: str, version: int) -> bool:
    """Delete a version's files (mapped readers keep their pages until they unmap)."""
    path = version_dir(root, job, version)
    if not path.exists():
        return False
    # rename first so that no reader opens a half-deleted directory
    trash = job_dir(root, job) / f".tmp-del-{version:012d}-{uuid.uuid4().hex[:8]}"
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def clean_stale_temps(root: Path, job: str) -> list[str]:
    """Remove temp dirs left by dead writers (their flock is free); returns the removed names."""
    jdir = job_dir(root, job)
    removed: list[str] = []
    if not jdir.is_dir():
        return removed
    for p in jdir.iterdir():
        if not p.name.startswith(".tmp-"):
            continue
        lock = p / ".lock"
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            # a deletion in progress, or a writer between mkdir and creating its lock: old enough
            # means its owner is gone
            if time.time() - p.stat().st_mtime > STALE_UNLOCKED_S:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live writer holds it
        finally:
            os.close(fd)
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    return removed


def describe(index: VersionIndex) -> dict[str, Any]:
    return {
        "version": index.version,
        "shards": len(index.shards),
        "tensors": len(index.tensors),
        "bytes": index.total_bytes,
        "algorithm": index.algorithm,
    }
