"""Delta codec of shard bytes: shard i of version v encoded against a base version b the receiver
already holds, decoded bit-exactly and proved by v's tensor checksums.

Callers: transport/deltas.py (a holder encodes, a receiver decodes), bench/delta.py, tests.
Consecutive versions differ little: with fp32 master weights published in bf16, a step at
lr 1e-5 changes a few percent of the elements, each by an ulp or two. Per tensor matched by name
(same dtype and size) the codec takes the element-wise integer difference (wrapping, so
bijective), zigzags it (small signed → small unsigned), splits the elements into byte planes
(the high planes are then almost all zeros), and compresses the stream with zstd. Bytes of no
matched tensor (padding, new tensors) go through as they are. bench/delta.py measured the
choice on real training steps (XOR and plain difference compress 5-30 % worse).

Payload: b"TDLT" + 4-byte big-endian header length + JSON header + one zstd frame. The header
names the version, shard, size and target digest the delta rebuilds, and the base version with
a digest over the base tensors' checksums it was made against: a receiver whose base differs
gets BaseMismatch before any byte is written. A damaged payload raises CorruptDelta; a decoded
shard whose checksums differ from v's index (a corrupt base, a wrong delta) ChecksumMismatch.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import hashing, layout

FORMAT = "tandem-delta-v1"
METHOD = "zigzag-sub+byteplanes+zstd"
MAGIC = b"TDLT"
_HLEN = struct.Struct(">I")
CHUNK = 8 << 20  # bytes transformed at a time: both sides cut segments at the same places
LEVEL = 1  # zstd level: 3 compressed no better on real steps and took longer
_SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class DeltaError(errors.InvalidVersion):
    """A delta could not rebuild the shard it names; the caller pulls the full shard instead."""

    code = "delta_error"


class CorruptDelta(DeltaError):
    """The payload is damaged: bad framing, a broken zstd stream, or a header for another shard."""

    code = "corrupt_delta"


class BaseMismatch(DeltaError):
    """The delta was made against a base whose tensors differ from the receiver's base."""

    code = "base_mismatch"


@dataclass(frozen=True)
class Segment:
    """Bytes [start, end) of a shard; `base` is the base tensor it is differenced against (None:
    sent as is), `itemsize` the element width of the difference."""

    start: int
    end: int
    itemsize: int = 1
    base: layout.TensorRecord | None = None


def segments(index: layout.VersionIndex, shard: int, base: layout.VersionIndex) -> list[Segment]:
    """Cover shard `shard` of `index` with segments, tensors matched by name in `base`."""
    if not 0 <= shard < len(index.shards):
        raise errors.VersionNotFound(f"version {index.version} has no shard {shard}")
    by_name = {t.name: t for t in base.tensors}
    out: list[Segment] = []
    pos, total = 0, index.shards[shard].nbytes
    for rec in sorted((t for t in index.tensors if t.shard == shard), key=lambda t: t.offset):
        if rec.offset < pos or rec.offset + rec.nbytes > total:
            raise errors.TornVersion(f"version {index.version}: tensor {rec.name} overlaps or leaves shard {shard}")
        if rec.offset > pos:
            out.append(Segment(pos, rec.offset))
        b = by_name.get(rec.name)
        size = layout.torch_dtype(rec.dtype).itemsize
        if b is not None and b.dtype == rec.dtype and b.nbytes == rec.nbytes and size in _SIGNED:
            out.append(Segment(rec.offset, rec.offset + rec.nbytes, size, b))
        elif rec.nbytes:
            out.append(Segment(rec.offset, rec.offset + rec.nbytes))
        pos = rec.offset + rec.nbytes
    if pos < total:
        out.append(Segment(pos, total))
    return out


def base_digest(segs: Sequence[Segment], base: layout.VersionIndex) -> str:
    """Identity of the base bytes a delta depends on: its version and matched tensors' checksums."""
    sums = [f"{s.base.name}:{s.base.checksum}" for s in segs if s.base is not None]
    return hashing.digest_strings([f"v{base.version}", *sums], base.algorithm)


def _pieces(segs: Sequence[Segment]) -> Iterator[tuple[Segment, int, int]]:
    """(segment, start, end) in chunks of at most CHUNK bytes, whole elements each."""
    for s in segs:
        step = CHUNK - CHUNK % s.itemsize
        for a in range(s.start, s.end, step):
            yield s, a, min(s.end, a + step)


def _forward(new: np.ndarray, old: np.ndarray, k: int) -> np.ndarray:
    d = new.view(_SIGNED[k]) - old.view(_SIGNED[k])  # wraps: bijective on the bit patterns
    z = (d << 1) ^ (d >> (8 * k - 1))  # zigzag
    return np.ascontiguousarray(z.view(np.uint8).reshape(-1, k).T)  # byte planes


def _inverse(planes: np.ndarray, old: np.ndarray, k: int, out: np.ndarray) -> None:
    ut = _UNSIGNED[k]
    m = planes.size // k
    z = planes[:m].astype(ut)  # byte planes back to elements: contiguous reads, no transpose
    for i in range(1, k):
        z |= planes[i * m : (i + 1) * m].astype(ut) << ut(8 * i)
    sign = z & ut(1)
    np.negative(sign, out=sign)
    z >>= ut(1)
    z ^= sign  # un-zigzag, in place
    np.add(old.view(_SIGNED[k]), z.view(_SIGNED[k]), out=out.view(_SIGNED[k]))


def _base_bytes(base_shards: Sequence[np.ndarray], s: Segment, a: int, b: int) -> np.ndarray:
    rec = s.base
    if rec is None or rec.shard >= len(base_shards):
        raise BaseMismatch(f"base tensor for bytes [{a}, {b}) is not in the base's shards")
    buf = base_shards[rec.shard]
    lo = rec.offset + (a - s.start)
    if lo + (b - a) > buf.size:
        raise BaseMismatch(f"base tensor {rec.name} lies outside its shard {rec.shard}")
    return buf[lo : lo + (b - a)]


def encode(
    index: layout.VersionIndex,
    shard: int,
    data: np.ndarray,
    base: layout.VersionIndex,
    base_shards: Sequence[np.ndarray],
    level: int = LEVEL,
) -> bytes:
    """Payload rebuilding shard `shard` of `index` (its bytes: `data`, uint8) from `base`."""
    nbytes = index.shards[shard].nbytes if 0 <= shard < len(index.shards) else -1
    if data.size != nbytes:
        raise errors.TornVersion(f"version {index.version} shard {shard}: {data.size} bytes, index says {nbytes}")
    segs = segments(index, shard, base)
    header = {
        "format": FORMAT,
        "method": METHOD,
        "version": index.version,
        "shard": shard,
        "nbytes": nbytes,
        "digest": index.shards[shard].digest,
        "base": base.version,
        "base_digest": base_digest(segs, base),
    }
    comp = zstandard.ZstdCompressor(level=level, write_checksum=True).compressobj()  # damage → ZstdError
    body = [comp.compress(_transform(s, data[a:b], base_shards, a, b)) for s, a, b in _pieces(segs)]
    raw = json.dumps(header).encode()
    return b"".join([MAGIC, _HLEN.pack(len(raw)), raw, *body, comp.flush()])


def _transform(s: Segment, new: np.ndarray, base_shards: Sequence[np.ndarray], a: int, b: int) -> bytes:
    if s.base is None:
        return new.tobytes()
    return _forward(new, _base_bytes(base_shards, s, a, b), s.itemsize).tobytes()


def read_header(payload: bytes | memoryview) -> tuple[dict[str, Any], int]:
    """The payload's header and where its zstd frame starts (CorruptDelta if malformed)."""
    view = memoryview(payload)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise CorruptDelta("not a tandem delta (bad magic)")
    (n,) = _HLEN.unpack(view[4:8])
    try:
        header = json.loads(bytes(view[8 : 8 + n]))
    except ValueError as e:
        raise CorruptDelta(f"unreadable delta header: {e}") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("method") != METHOD:
        raise CorruptDelta(f"unknown delta format or method in header {header!r:.200}")
    return header, 8 + n


def decode(
    payload: bytes | memoryview,
    index: layout.VersionIndex,
    shard: int,
    base: layout.VersionIndex,
    base_shards: Sequence[np.ndarray],
    out: np.ndarray,
) -> None:
    """Rebuild shard `shard` of `index` into `out` (uint8, the shard's size), then prove it with
    the index's tensor checksums. Raises BaseMismatch, CorruptDelta or ChecksumMismatch; `out`
    then holds garbage and must not be used."""
    header, start = read_header(payload)
    want = (index.version, shard, index.shards[shard].nbytes, index.shards[shard].digest)
    got = (header.get("version"), header.get("shard"), header.get("nbytes"), header.get("digest"))
    if got != want:
        raise CorruptDelta(f"delta rebuilds (version, shard, bytes, digest) {got}, wanted {want}")
    if out.size != want[2]:
        raise ValueError(f"output buffer has {out.size} bytes, shard {shard} has {want[2]}")
    segs = segments(index, shard, base)
    if header.get("base") != base.version or header.get("base_digest") != base_digest(segs, base):
        raise BaseMismatch(
            f"delta of version {index.version} shard {shard} was made against base {header.get('base')} "
            f"with other tensors than this pod's base {base.version}"
        )
    body = memoryview(payload)[start:]
    buf = bytearray(CHUNK)
    try:
        with zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=False) as reader:
            for s, a, b in _pieces(segs):
                view, got_n = memoryview(buf)[: b - a], 0
                while got_n < b - a:
                    k = reader.readinto(view[got_n:])
                    if k == 0:
                        raise CorruptDelta(f"delta of version {index.version} shard {shard} ends early, at byte {a}")
                    got_n += k
                chunk = np.frombuffer(view, dtype=np.uint8)
                if s.base is None:
                    out[a:b] = chunk
                else:
                    _inverse(chunk, _base_bytes(base_shards, s, a, b), s.itemsize, out[a:b])
            if reader.read(1):
                raise CorruptDelta(f"delta of version {index.version} shard {shard} holds more bytes than the shard")
    except zstandard.ZstdError as e:
        raise CorruptDelta(f"delta of version {index.version} shard {shard}: {e}") from e
    verify(index, shard, out)


def verify(index: layout.VersionIndex, shard: int, data: np.ndarray) -> None:
    """Every tensor checksum of `shard` recomputed from `data` (ChecksumMismatch on the first miss)."""
    for rec in index.tensors:
        if rec.shard != shard:
            continue
        got = hashing.checksum(data[rec.offset : rec.offset + rec.nbytes], index.algorithm)
        if got != rec.checksum:
            raise errors.ChecksumMismatch(
                f"version {index.version}: tensor {rec.name} rebuilt from a delta has checksum {got}, "
                f"index says {rec.checksum}"
            )


def open_shards(path: Path, index: layout.VersionIndex) -> list[np.ndarray]:
    """Read-only maps (uint8) of a complete version's shard files, by shard number."""
    out: list[np.ndarray] = []
    for s in index.shards:
        f = Path(path) / s.file
        layout.checked_shard_size(f, s.nbytes)
        out.append(np.memmap(f, dtype=np.uint8, mode="r") if s.nbytes else np.empty(0, dtype=np.uint8))
    return out
