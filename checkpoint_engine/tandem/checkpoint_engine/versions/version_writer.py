"""Writing one version into the shared-memory layout (`layout`): tensors into aligned shard files, then one rename.

Caller: the publisher (`..service.publisher`: every published version), the rollout sidecar's kept versions,
the tests and the benchmarks. `write_version` takes its steps in order: a locked temp directory beside the
versions (`_temp_dir`: a dead writer's is found by its free flock and removed by `layout.clean_stale_temps`), the
tensors appended to shard files in the iterator's order (`_Shards`: a shard closes when the next tensor would
make it exceed `shard_bytes`; its files recycled from `slots` when there are spares), the index written last,
and the temp directory renamed into place, so a reader sees the whole version or nothing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import hashing, slots
from tandem.checkpoint_engine.versions.layout import (
    ALIGN,
    DEFAULT_SHARD_BYTES,
    INDEX,
    ShardRecord,
    TensorRecord,
    VersionIndex,
    dtype_name,
    job_dir,
    version_dir,
)


@dataclass
class WriteReport:
    path: Path
    index: VersionIndex
    seconds: float
    bytes: int
    recycled: int = 0  # bytes of spare files reused as this version's shards (pages not faulted anew)


def write_version(
    root: Path,
    job: str,
    version: int,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    fsync: bool = False,
    spares: Path | None = None,
    expected_shards: list[int] | None = None,
    adapter: dict[str, Any] | None = None,
) -> WriteReport:
    """Write all tensors of `version` into a temp dir, then rename it into place atomically.

    Tensors are written in the iterator's order; a shard closes when the next tensor would make
    it exceed `shard_bytes` (a larger tensor gets a shard of its own). With `spares` (slots.py),
    each shard file is a spare file of a released version when there is one (the best fit for
    `expected_shards[i]`, else for `shard_bytes`), overwritten in place and cut to its size. `adapter` (a
    PEFT adapter config) marks a version of LoRA adapters only (adapters.py).
    """
    if shard_bytes <= 0:
        raise ValueError("shard_bytes must be positive")
    t0 = time.perf_counter()
    final = version_dir(root, job, version)
    if final.exists():
        raise errors.VersionExists(f"{final} already exists")
    with _temp_dir(root, job, version) as tmp:
        shards = _Shards(tmp, shard_bytes, fsync, spares, expected_shards)
        for name, tensor in named_tensors:
            shards.add(name, tensor)
        shards.close()
        index = VersionIndex(
            job=job,
            version=version,
            algorithm=hashing.ALGORITHM,
            created=time.time(),
            shards=shards.shards,
            tensors=shards.tensors,
            adapter=adapter,
        )
        (tmp / INDEX).write_text(index.model_dump_json())
        os.rename(tmp, final)  # atomic: the version appears complete or not at all
        os.unlink(final / ".lock")
    return WriteReport(final, index, time.perf_counter() - t0, index.total_bytes, shards.recycled)


@contextmanager
def _temp_dir(root: Path, job: str, version: int) -> Iterator[Path]:
    """A fresh `.tmp-v…` directory beside the job's versions, its `.lock` flock'ed while the body runs; removed
    when the body fails (a body that succeeds has renamed it into place)."""
    jdir = job_dir(root, job)
    jdir.mkdir(parents=True, exist_ok=True)
    tmp = jdir / f".tmp-v{version:012d}-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    lock_fd = os.open(tmp / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock_fd)


class _Shards:
    """The shard files of a version being written: each tensor appended to the open shard, 64-byte aligned, with
    its checksum; a shard's record (size, digest over its tensors' checksums) made when it closes."""

    def __init__(self, tmp: Path, shard_bytes: int, fsync: bool, spares: Path | None,
                 expected_shards: list[int] | None) -> None:
        self.tmp, self.shard_bytes, self.fsync = tmp, shard_bytes, fsync
        self.spares, self.expected_shards = spares, expected_shards
        self.tensors: list[TensorRecord] = []
        self.shards: list[ShardRecord] = []
        self.recycled = 0
        self._names: set[str] = set()
        self._fh: BinaryIO | None = None
        self._pos = 0
        self._sums: list[str] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Append `tensor` to the open shard, closing it first when the tensor would make it exceed shard_bytes."""
        if name in self._names:
            raise ValueError(f"tensor {name!r} given twice")
        self._names.add(name)
        flat = _as_bytes(tensor)
        nbytes = int(flat.numel())
        if self._fh is not None and self._pos > 0 and self._pos + nbytes > self.shard_bytes:
            self.close()
        fh = self._fh if self._fh is not None else self._open()
        arr = _host_bytes(flat)
        checksum = hashing.checksum(arr)
        self.tensors.append(
            TensorRecord(
                name=name,
                dtype=dtype_name(tensor.dtype),
                shape=list(tensor.shape),
                shard=len(self.shards),
                offset=self._pos,
                nbytes=nbytes,
                checksum=checksum,
            )
        )
        self._sums.append(checksum)
        fh.write(memoryview(arr))
        pad = _pad(nbytes)
        if pad:
            fh.write(b"\0" * pad)
        self._pos += nbytes + pad

    def _open(self) -> BinaryIO:
        """The next shard's file: a spare of a released version (the best fit for its expected size) or a new one."""
        i = len(self.shards)
        expected = self.expected_shards
        want = expected[i] if expected is not None and i < len(expected) else self.shard_bytes
        fd, reused = slots.open_shard(self.tmp / f"shard-{i:05d}.bin", self.spares, want)
        self.recycled += os.fstat(fd).st_size if reused else 0
        self._fh = open(fd, "wb")  # noqa: SIM115 - closed in close(); an fd is never truncated on open
        self._pos, self._sums = 0, []
        return self._fh

    def close(self) -> None:
        """Close the open shard (if any): cut to its size, synced when asked, and recorded."""
        if self._fh is None:
            return
        fh, self._fh = self._fh, None
        fh.flush()
        fh.truncate(self._pos)  # a recycled file may be longer than this shard
        if self.fsync:
            os.fsync(fh.fileno())
        fh.close()
        i = len(self.shards)
        self.shards.append(
            ShardRecord(index=i, file=f"shard-{i:05d}.bin", nbytes=self._pos, digest=hashing.digest_strings(self._sums))
        )


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a CPU, contiguous copy-free (when possible) form of `t`."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous().reshape(-1).view(torch.uint8)


def _host_bytes(flat: torch.Tensor) -> Any:
    """A numpy view of a CPU uint8 tensor's bytes that leaves the tensor's storage resizable.

    `Tensor.numpy()` would mark the storage non-resizable for good; the exported tensors can be
    the trainer's live parameters, whose storages the offloader must later release.
    """
    import ctypes

    import numpy as np

    n = int(flat.numel())
    if n == 0:
        return np.empty(0, dtype=np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(flat.data_ptr()))


def _pad(n: int, align: int = ALIGN) -> int:
    return (-n) % align
