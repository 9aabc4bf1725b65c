"""Per-shard verification of a version being received, overlapped with the transfer.

Caller: receiver.py. As soon as the last byte of shard i lands, `ShardVerifier.submit(i)` queues
it; one background thread recomputes the checksum of every tensor in that shard from the shard
file and checks them against the version index, whose per-shard digest (over those checksums)
was itself checked against etcd's shard records. So etcd is the root of trust, shard i is
verified while shard i+1 arrives, and only the last shard's check remains once bytes stop
moving. A shard that fails is reported back (`failed()`) so the receiver pulls it again from
another source, without touching the shards already verified.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
import time
from collections import defaultdict
from pathlib import Path

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import hashing, layout


def shard_digest_ok(index: layout.VersionIndex, shard: int) -> bool:
    """Whether the index's tensor checksums of `shard` hash to the shard's digest."""
    sums = [t.checksum for t in index.tensors if t.shard == shard]
    return hashing.digest_strings(sums, index.algorithm) == index.shards[shard].digest


def check_shard(path: Path, index: layout.VersionIndex, shard: int) -> None:
    """Recompute every tensor checksum of `shard` in the file at `path`; raise ChecksumMismatch."""
    if not shard_digest_ok(index, shard):
        raise errors.ChecksumMismatch(f"version {index.version}: index checksums of shard {shard} break its digest")
    nbytes = index.shards[shard].nbytes
    if nbytes == 0:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        view = memoryview(mm)
        try:
            for rec in index.tensors:
                if rec.shard != shard:
                    continue
                if rec.offset + rec.nbytes > nbytes:
                    raise errors.TornVersion(f"tensor {rec.name} lies outside shard {shard}")
                got = hashing.checksum(view[rec.offset : rec.offset + rec.nbytes], index.algorithm)
                if got != rec.checksum:
                    raise errors.ChecksumMismatch(
                        f"version {index.version}: tensor {rec.name} (shard {shard}, offset {rec.offset}) "
                        f"has checksum {got}, index says {rec.checksum}"
                    )
        finally:
            view.release()
    finally:
        mm.close()


class ShardVerifier:
    """One thread checking shards as they complete; `wait` blocks until all submitted are checked."""

    def __init__(self, tmp: Path, index: layout.VersionIndex) -> None:
        self.tmp, self.index = tmp, index
        self.ok: set[int] = set()
        self.attempts: dict[int, int] = defaultdict(int)
        self.seconds = 0.0  # time spent checking (off the critical path except the last shard)
        self._bad: list[tuple[int, str]] = []
        self._pending: set[int] = set()
        self._cond = threading.Condition()
        self._q: queue.Queue[int | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="shard-verify", daemon=True)
        self._thread.start()

    def submit(self, shard: int) -> None:
        with self._cond:
            self._pending.add(shard)
            self.attempts[shard] += 1
        self._q.put(shard)

    def busy(self, shard: int) -> bool:
        """Submitted and not yet judged, or judged good: not to be pulled again."""
        with self._cond:
            return shard in self._pending or shard in self.ok

    def failed(self) -> list[tuple[int, str]]:
        """Shards found corrupt since the last call, with the reason."""
        with self._cond:
            out, self._bad = self._bad, []
            return out

    def wait(self, timeout: float) -> bool:
        """Until nothing is pending or a failure is known (then the caller re-pulls); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending or bool(self._bad), timeout)

    def all_ok(self) -> bool:
        with self._cond:
            return len(self.ok) == len(self.index.shards)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(30)

    def _run(self) -> None:
        while (shard := self._q.get()) is not None:
            t0 = time.perf_counter()
            try:
                check_shard(self.tmp / self.index.shards[shard].file, self.index, shard)
                reason = ""
            except (errors.CheckpointEngineError, OSError, ValueError) as e:
                reason = str(e)
            with self._cond:
                self.seconds += time.perf_counter() - t0
                self._pending.discard(shard)
                if reason:
                    self._bad.append((shard, reason))
                else:
                    self.ok.add(shard)
                self._cond.notify_all()
