"""Durable copies of published versions, for resuming after the pods (and their /dev/shm) are gone.

Role: a published version lives in its pod's shared memory, which a gang restart deletes with the
pod. `DurableStore` keeps copies on a volume (a PersistentVolumeClaim or hostPath mounted by the
operator's pod builders; a local directory under `tandem run`):

    <root>/<namespace>/<job>/<uid>/v<v:012d>/        index.json, shard-*.bin (as in shm),
                                                    checkpoint.json (iteration, job uid, time)
    <root>/<namespace>/<job>/<uid>/.tmp-v…-<uuid>/   a copy in progress (`.lock` flock'ed)
    <root>/<namespace>/<job>/<uid>/train/v<v:012d>/  the trainer ranks' own state for version v
                                                    (optimizer, critic): one file per rank,
                                                    written by `write_train_file`

`<uid>` is the RLHFJob's metadata.uid, so a job deleted and created again under the same name
never resumes from its predecessor's weights (its directory is left for the user to remove).
A copy appears by one rename of a complete, fsync'ed temp directory, and `latest()` verifies
every checksum before a copy is trusted, so a resume loads a whole version or nothing.
Callers: the trainer's persister (`tandem.sidecars.trainer.loop.recovery.persist`) saves, the driver's
resume (`tandem.sidecars.trainer.loop.recovery.resume`) reads;
`tandem.sidecars.trainer.loop.recovery.train_state` writes and reads the per-rank training state.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import layout

log = logging.getLogger(__name__)

META = "checkpoint.json"
TRAIN = "train"


@dataclass(frozen=True)
class DurableVersion:
    version: int
    iteration: int  # iterations completed when this version was published (the next one to run)
    path: Path


class DurableStore:
    def __init__(self, root: Path, namespace: str, job: str, uid: str, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.base = Path(root) / namespace / job  # layout's "root"; the uid is layout's "job"
        self.uid, self.keep = uid, keep

    @property
    def directory(self) -> Path:
        return layout.job_dir(self.base, self.uid)

    def versions(self) -> list[int]:
        return layout.list_versions(self.base, self.uid)

    def save(self, source: Path, version: int, iteration: int) -> DurableVersion:
        """Copy the complete version directory `source` (index + shards) and make it durable."""
        index = layout.read_index(source)
        if index.version != version:
            raise errors.InvalidVersion(f"{source} holds version {index.version}, not {version}")
        final = layout.version_dir(self.base, self.uid, version)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".tmp-v{version:012d}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        lock_fd = os.open(tmp / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            names = [shard.file for shard in index.shards] + [layout.INDEX]
            for name in names:
                _copy(source / name, tmp / name)
            meta = {"version": version, "iteration": iteration, "uid": self.uid, "saved": time.time()}
            (tmp / META).write_text(json.dumps(meta))
            for name in [*names, META]:  # after all writes: the device flushes them together
                fsync_path(tmp / name)
            os.unlink(tmp / ".lock")
            if final.exists():  # an earlier attempt of the same version: replace it
                layout.remove_version(self.base, self.uid, version)
            os.rename(tmp, final)
            fsync_path(self.directory)  # the rename itself
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            os.close(lock_fd)
        self.gc()
        return DurableVersion(version, iteration, final)

    def gc(self) -> list[int]:
        """Remove copies beyond the newest `keep`, their training state, and temp dirs of dead writers.

        Training state newer than the oldest kept copy stays: its weights may still be on the way.
        """
        removed = self.versions()[: -self.keep]
        for v in removed:
            layout.remove_version(self.base, self.uid, v)
        kept = self.versions()
        for v in self.train_versions():
            if kept and v < kept[0]:
                layout.remove_version(self.directory, TRAIN, v)
        layout.clean_stale_temps(self.base, self.uid)
        return removed

    # ---- the trainer ranks' own state, beside the weights ----------------------------------------
    def train_dir(self, version: int) -> Path:
        return layout.version_dir(self.directory, TRAIN, version)

    def train_versions(self) -> list[int]:
        return layout.list_versions(self.directory, TRAIN)

    def write_train_file(self, version: int, name: str, write: Callable[[Path], None]) -> Path:
        """`write(tmp)` then fsync and one rename to `train_dir(version)/name`: whole or absent."""
        target = self.train_dir(version)
        target.mkdir(parents=True, exist_ok=True)
        tmp = target / f".tmp-{name}-{uuid.uuid4().hex[:12]}"
        try:
            write(tmp)
            fsync_path(tmp)
            os.replace(tmp, target / name)
            fsync_path(target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return target / name

    def read(self, version: int) -> DurableVersion:
        """Check one copy completely (metadata, index, every checksum); raise if it is not usable."""
        path = layout.version_dir(self.base, self.uid, version)
        try:
            meta = json.loads((path / META).read_text())
        except (OSError, ValueError) as e:
            raise errors.TornVersion(f"{path}: no readable {META}: {e}") from e
        if meta.get("uid") != self.uid or meta.get("version") != version or not isinstance(meta.get("iteration"), int):
            raise errors.InvalidVersion(f"{path / META} does not describe version {version} of job uid {self.uid}")
        layout.MappedVersion(path).verify_checksums()
        return DurableVersion(version, int(meta["iteration"]), path)

    def latest(self) -> DurableVersion | None:
        """The newest copy that verifies; damaged newer copies are logged and skipped."""
        for v in reversed(self.versions()):
            try:
                return self.read(v)
            except (errors.CheckpointEngineError, OSError) as e:
                log.warning("durable version %d skipped: %s", v, e)
        return None


def _copy(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)  # sendfile(2) on Linux: in-kernel, no userspace buffer
    if dst.stat().st_size != src.stat().st_size:
        raise errors.TornVersion(f"copy of {src} to {dst} is short")


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

