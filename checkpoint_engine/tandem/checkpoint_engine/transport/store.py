"""What a pod can serve: complete versions in its shm dir, and versions it is still receiving.

Callers: holder_server.py (reads), receiver.py (creates an `Incoming` per version it pulls and reports
progress into it), node.py (`recycle`: a released version's shard files become spares, the
pages the next version is received into; slots.py's pool, shared with the publisher). An
`Incoming` is a layout.py temp dir (`.tmp-v…` with a flock'ed `.lock`, so
`layout.clean_stale_temps` removes it if this pod dies) whose shard files are created at full
size (from spares when there are some) and mapped ahead of the receive; `avail[i]` counts the
bytes of shard i already present, and waiting servers are woken as it grows, so a receiver
forwards chunk k while it receives chunk k+1.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import layout, slots

SPARE = slots.SPARE  # <job dir>/.spare/: shard files of released versions, reused as receive targets
take_spare = slots.take  # the best-fitting spare: its pages are already allocated (slots.py)


class ShardDest:
    """Where a shard being received lands: its file, and a map of it (MAP_POPULATE: page tables
    filled in one call, not one fault per 4 KiB) that transports receive into directly."""

    def __init__(self, fd: int, nbytes: int) -> None:
        self.fd, self.nbytes = fd, nbytes
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()

    def view(self) -> memoryview:
        if self.nbytes == 0:
            return memoryview(bytearray())
        with self._lock:
            if self._map is None:
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                self._map = mmap.mmap(self.fd, self.nbytes, flags=flags)
            return memoryview(self._map)

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still exported (a registration or transfer)
                pass


def _populate(dests: list[ShardDest]) -> None:
    for d in dests:
        try:
            d.view().release()
        except (OSError, ValueError):  # closed meanwhile (abandoned receive): nothing to prepare
            return


class Incoming:
    """A version being received into a temp dir of the layout."""

    def __init__(self, root: Path, job: str, v: int) -> None:
        self.v, self.root, self.job = v, root, job
        jdir = layout.job_dir(root, job)
        jdir.mkdir(parents=True, exist_ok=True)
        self.tmp = jdir / f".tmp-v{v:012d}-{uuid.uuid4().hex[:12]}"
        self.tmp.mkdir()
        self._lock_fd = os.open(self.tmp / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self.cond = threading.Condition()
        self.index: layout.VersionIndex | None = None
        self.index_bytes = b""
        self.avail: list[int] = []
        self.fds: list[int] = []
        self.dests: list[ShardDest] = []
        self.addrs: list[int] = []  # where peers read each shard (RDMA registrations), 0 for TCP
        self.failed = False
        self.done = False
        self._populating: threading.Thread | None = None

    def set_index(self, raw: bytes, index: layout.VersionIndex) -> None:
        """Create every shard file at full size; from now on peers can stream from us."""
        dests = []
        for s in index.shards:
            take_spare(layout.job_dir(self.root, self.job) / SPARE, s.nbytes, self.tmp / s.file)
            fd = os.open(self.tmp / s.file, os.O_CREAT | os.O_RDWR, 0o644)
            os.ftruncate(fd, s.nbytes)
            self.fds.append(fd)
            dests.append(ShardDest(fd, s.nbytes))
        (self.tmp / layout.INDEX).write_bytes(raw)
        # map (and so fault in, fresh pages included) every shard ahead of the receive, off its path
        self._populating = threading.Thread(target=_populate, args=(dests,), name="shard-populate", daemon=True)
        self._populating.start()
        with self.cond:
            self.dests = dests
            self.index, self.index_bytes = index, raw
            self.avail = [0] * len(index.shards)
            self.cond.notify_all()

    def reset(self, shard: int) -> None:
        """Forget the bytes of `shard` (they failed verification): it is pulled again from 0.
        Downstreams that already streamed them detect the corruption with their own checks."""
        with self.cond:
            self.avail[shard] = 0
            self.cond.notify_all()

    def advance(self, shard: int, avail: int) -> None:
        with self.cond:
            if avail > self.avail[shard]:
                self.avail[shard] = avail
                self.cond.notify_all()

    def fail(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify_all()

    def wait_index(self, timeout: float) -> bytes:
        with self.cond:
            self.cond.wait_for(lambda: self.index is not None or self.failed, timeout)
            if self.index is None:
                raise errors.VersionNotFound(f"index of version {self.v} not received yet")
            return self.index_bytes

    def wait_avail(self, shard: int, more_than: int, timeout: float) -> int:
        """Bytes of `shard` present, once more than `more_than` (or the shard's end) are."""
        with self.cond:
            if self.index is None or not 0 <= shard < len(self.avail):
                raise errors.VersionNotFound(f"version {self.v} has no shard {shard} here")
            total = self.index.shards[shard].nbytes
            self.cond.wait_for(
                lambda: self.failed or self.avail[shard] > more_than or self.avail[shard] >= total, timeout
            )
            if self.failed:
                raise errors.VersionNotFound(f"receive of version {self.v} was abandoned")
            return self.avail[shard]

    def close_maps(self) -> None:
        for d in self.dests:
            d.close()

    def finish(self, final: Path) -> None:
        """Rename the complete temp dir into place (open fds keep serving the renamed files)."""
        if final.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            os.rename(self.tmp, final)
            os.unlink(final / ".lock")
        with self.cond:
            self.done = True
            self.cond.notify_all()
        os.close(self._lock_fd)

    def abandon(self) -> None:
        self.fail()
        if self._populating is not None:  # it maps our fds: they must not be closed (and reused) under it
            self._populating.join(60)
        self.close_maps()
        shutil.rmtree(self.tmp, ignore_errors=True)
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        os.close(self._lock_fd)


class LocalStore:
    """One job's versions on this pod: complete ones on disk, incoming ones in memory."""

    def __init__(self, root: Path, job: str) -> None:
        self.root, self.job = Path(root), job
        self._lock = threading.Lock()
        self._incoming: dict[int, Incoming] = {}
        self._complete_maps: dict[tuple[int, int], mmap.mmap] = {}
        self.created = time.time()

    def begin(self, v: int) -> Incoming:
        with self._lock:
            cur = self._incoming.get(v)
            if cur is not None and not cur.failed and not cur.done:
                raise errors.WrongPhase(f"version {v} is already being received")
            inc = Incoming(self.root, self.job, v)
            self._incoming[v] = inc
            return inc

    def drop(self, v: int) -> None:
        """Forget an incoming entry (after abandon, or when its version is removed)."""
        with self._lock:
            inc = self._incoming.pop(v, None)
        if inc is not None and inc.done:
            inc.close_maps()
            for fd in inc.fds:
                os.close(fd)
            inc.fds = []

    def incoming(self, v: int) -> Incoming | None:
        with self._lock:
            inc = self._incoming.get(v)
        return None if inc is None or inc.failed else inc

    def complete_view(self, v: int, shard: int) -> tuple[Path, memoryview]:
        """A (cached) writable map of a complete version's shard, for transports that read
        memory directly (RDMA registers it); peers only read it."""
        path = self.complete_dir(v)
        if path is None:
            raise errors.VersionNotFound(f"version {v} is not here")
        index = layout.read_index(path)
        if not 0 <= shard < len(index.shards):
            raise errors.VersionNotFound(f"version {v} has no shard {shard}")
        f = path / index.shards[shard].file
        with self._lock:
            mm = self._complete_maps.get((v, shard))
            if mm is None:
                if index.shards[shard].nbytes == 0:
                    return f, memoryview(bytearray())
                fd = os.open(f, os.O_RDWR)
                try:
                    mm = mmap.mmap(fd, index.shards[shard].nbytes, flags=mmap.MAP_SHARED)
                finally:
                    os.close(fd)
                self._complete_maps[(v, shard)] = mm
        return f, memoryview(mm)

    def recycle(self, v: int, keep_bytes: int | None = None) -> bool:
        """Remove complete version `v` from view and keep its shard files as spares for the next
        version received (caller: node.py, for versions nobody may map any more). Spares beyond
        `keep_bytes` (default: the size of `v`) are deleted, largest first kept."""
        path = self.complete_dir(v)
        if path is None:
            return False
        with self._lock:
            for key in [k for k in self._complete_maps if k[0] == v]:
                try:
                    self._complete_maps.pop(key).close()
                except BufferError:  # still registered with a transport: leave it to the GC
                    pass
        jdir = layout.job_dir(self.root, self.job)
        trash = jdir / f".tmp-del-{v:012d}-{uuid.uuid4().hex[:8]}"
        os.rename(path, trash)  # readers no longer find it
        spare = jdir / SPARE
        spare.mkdir(exist_ok=True)
        total = 0
        for f in trash.iterdir():
            if f.name.startswith("shard-"):
                total += f.stat().st_size
                os.rename(f, spare / f"{uuid.uuid4().hex}.bin")
        shutil.rmtree(trash, ignore_errors=True)
        limit = total if keep_bytes is None else keep_bytes
        kept = 0
        for size, f in sorted(((f.stat().st_size, f) for f in spare.iterdir()), reverse=True):
            if kept + size > limit:
                f.unlink(missing_ok=True)
            else:
                kept += size
        return True

    def complete_dir(self, v: int) -> Path | None:
        path = layout.version_dir(self.root, self.job, v)
        return path if (path / layout.INDEX).exists() else None
