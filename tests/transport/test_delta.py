"""Delta updates: the codec (checkpoint_engine/versions/delta.py) and the broadcast's delta pass
(transport/deltas.py), on versions from real training steps (train_versions.py).

Covers: shards rebuilt bit-exact from a delta against the previous version (bf16 and fp32, a new
tensor, padding); a damaged payload, another base, or damaged base bytes refused with a typed
error; across real holder servers and receivers with real etcd: a receiver holding v-1 gets v
as deltas (fewer bytes on the wire, no full pull), one without a base or whose holder lacks the
base falls back to full shards, and a corrupt base or a corrupt delta costs only a full pull of
the shards concerned, never a torn version.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from broadcast_pods import same_bytes
from train_versions import trained_versions

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.transport import BroadcastNode
from tandem.checkpoint_engine.versions import delta, layout, version_writer

SHARD = 96 << 10  # several shards per version


_VERSIONS: dict[torch.dtype, list[list[tuple[str, torch.Tensor]]]] = {}


def versions(dtype: torch.dtype = torch.bfloat16) -> list[list[tuple[str, torch.Tensor]]]:
    """v0 (initial), v1, v2 after one and two AdamW steps at lr 1e-5, trained once per dtype."""
    if dtype not in _VERSIONS:
        _VERSIONS[dtype] = trained_versions(steps=2, lr=1e-5, dtype=dtype)
    return _VERSIONS[dtype]


def _write(root: Path, v: int, tensors: list[tuple[str, torch.Tensor]]) -> tuple[layout.VersionIndex, list[Any]]:
    rep = version_writer.write_version(root, "job", v, tensors, shard_bytes=SHARD)
    return rep.index, delta.open_shards(rep.path, rep.index)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_round_trip_is_bit_exact_on_trained_versions(tmp_path: Path, dtype: torch.dtype) -> None:
    vs = versions(dtype)
    base, base_shards = _write(tmp_path, 1, vs[1])
    # v2 also carries a tensor the base lacks (sent as is) and one whose shape changed
    extra = [("new.weight", torch.randn(37, 3).to(dtype)), ("lm_head.weight", vs[2][-1][1][:-1].clone())]
    new, new_shards = _write(tmp_path, 2, [*vs[2][:-1], *extra])
    assert len(new.shards) > 2
    sent = 0
    for i, s in enumerate(new.shards):
        payload = delta.encode(new, i, new_shards[i], base, base_shards)
        sent += len(payload)
        out = np.full(s.nbytes, 0xA5, dtype=np.uint8)  # padding must come out as written, too
        delta.decode(payload, new, i, base, base_shards, out)
        assert out.tobytes() == new_shards[i].tobytes()
    if dtype == torch.bfloat16:  # a step at lr 1e-5 moves few bf16 values
        assert sent * 3 < new.total_bytes, (sent, new.total_bytes)
    else:
        assert sent < new.total_bytes


def test_damaged_payloads_are_refused(tmp_path: Path) -> None:
    base, base_shards = _write(tmp_path, 1, versions()[1])
    new, new_shards = _write(tmp_path, 2, versions()[2])
    good = delta.encode(new, 0, new_shards[0], base, base_shards)
    out = np.empty(new.shards[0].nbytes, dtype=np.uint8)
    flipped = bytearray(good)
    flipped[len(good) // 2 + 20] ^= 0xFF  # inside the zstd frame
    for bad in (good[: len(good) // 2], bytes(flipped), b"XXXX" + good[4:], good + b"\0" * 16):
        with pytest.raises(delta.CorruptDelta):
            delta.decode(bad, new, 0, base, base_shards, out)
    other = np.empty(new.shards[1].nbytes, dtype=np.uint8)
    with pytest.raises(delta.CorruptDelta, match="wanted"):  # a delta of shard 0 offered as shard 1
        delta.decode(good, new, 1, base, base_shards, other)


def test_another_base_or_damaged_base_bytes_are_refused(tmp_path: Path) -> None:
    base, base_shards = _write(tmp_path, 1, versions()[1])
    older, older_shards = _write(tmp_path, 0, versions()[0])
    new, new_shards = _write(tmp_path, 2, versions()[2])
    payload = delta.encode(new, 0, new_shards[0], base, base_shards)
    out = np.empty(new.shards[0].nbytes, dtype=np.uint8)
    with pytest.raises(delta.BaseMismatch):
        delta.decode(payload, new, 0, older, older_shards, out)
    damaged = [np.array(s) for s in base_shards]
    rec = next(t for t in base.tensors if t.shard == 0)
    damaged[0][rec.offset + 3] ^= 0x01
    with pytest.raises(errors.ChecksumMismatch):
        delta.decode(payload, new, 0, base, damaged, out)


# ---- across pods: real holder servers, receivers and etcd ---------------------------------------


class Cluster:
    """In-process pods on loopback: a publisher and receivers, each with its own shm dir."""

    def __init__(self, etcd: str, base: Path) -> None:
        self.etcd, self.base, self.job = etcd, base, "delta-" + base.name[-8:]
        self.nodes: dict[str, BroadcastNode] = {}
        self.regs: list[SyncRegistry] = []

    def node(self, pod: str) -> BroadcastNode:
        reg = SyncRegistry(self.etcd, "test", self.job, pod, "rollout", ttl=5, timeout=5).connect()
        self.regs.append(reg)
        node = BroadcastNode(reg, self.base / pod, transport="tcp", bind="127.0.0.1", stall_timeout=3,
                             token="test-token").start()
        self.nodes[pod] = node
        return node

    def dir(self, pod: str, v: int) -> Path:
        return layout.version_dir(self.base / pod, self.job, v)

    def close(self) -> None:
        for n in self.nodes.values():
            n.close()
        for r in self.regs:
            r.close()


@pytest.fixture
def cluster(etcd: Any, shm_base: Path) -> Iterator[Cluster]:
    c = Cluster(etcd.endpoint, shm_base)
    pub = c.node("pub")
    publisher = Publisher(shm_base / "pub", c.job, pub.registry, keep=4, shard_bytes=SHARD)
    for v in (1, 2):
        publisher.publish(v, versions()[v])
    yield c
    c.close()


def _tcp_bytes(node: BroadcastNode) -> int:
    return int(getattr(node.transport, "bytes_received", 0))


@pytest.mark.etcd
def test_receiver_holding_the_previous_version_gets_deltas(cluster: Cluster) -> None:
    r = cluster.node("r")
    first = r.receive(1)
    assert first.delta is not None and first.delta.base is None and first.delta.shards == 0
    full = _tcp_bytes(r)
    rep = r.receive(2)
    assert rep.delta is not None and rep.delta.base == 1, rep.delta
    index = layout.read_index(cluster.dir("pub", 2))
    assert rep.delta.shards == len(index.shards), rep.delta.fallbacks
    assert _tcp_bytes(r) == full  # nothing pulled in full
    assert rep.delta.wire_bytes * 3 < index.total_bytes, rep.delta
    same_bytes(cluster.dir("pub", 2), cluster.dir("r", 2))
    # r now holds v2 and v1 complete: it serves the same deltas to a later receiver
    late = cluster.node("late")
    late.receive(1)
    cluster.nodes["pub"].release(2)
    got = late.receive(2)
    assert got.delta is not None and got.delta.shards == len(index.shards), got.delta
    same_bytes(cluster.dir("pub", 1), cluster.dir("late", 1))
    same_bytes(cluster.dir("r", 2), cluster.dir("late", 2))


@pytest.mark.etcd
def test_no_base_or_a_holder_without_it_falls_back_to_full_shards(cluster: Cluster) -> None:
    fresh = cluster.node("fresh")
    rep = fresh.receive(2)
    assert rep.delta is not None and rep.delta.base is None and rep.delta.shards == 0
    assert _tcp_bytes(fresh) >= rep.bytes
    same_bytes(cluster.dir("pub", 2), cluster.dir("fresh", 2))
    r = cluster.node("r")
    r.receive(1)
    layout.remove_version(cluster.base / "pub", cluster.job, 1)  # the only holder of v2 lacks v1 now
    fresh.release(2)
    rep = r.receive(2)
    assert rep.delta is not None and rep.delta.base == 1 and rep.delta.shards == 0
    assert any("not complete here" in f for f in rep.delta.fallbacks), rep.delta.fallbacks
    same_bytes(cluster.dir("pub", 2), cluster.dir("r", 2))


@pytest.mark.etcd
def test_corrupt_base_or_corrupt_delta_costs_a_full_shard_never_a_torn_version(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    a.receive(1)
    b.receive(1)
    base = layout.read_index(cluster.dir("pub", 1))
    t0 = next(t for t in base.tensors if t.shard == 0 and t.nbytes > 64)
    t1 = next(t for t in base.tensors if t.shard == 1 and t.nbytes > 64)
    _flip(cluster.dir("a", 1) / base.shards[0].file, t0.offset + 10)  # a's own base is damaged
    # the holder's base is damaged too: its deltas of shard 1 rebuild wrong bytes (v2's checksums tell)
    _flip(cluster.dir("pub", 1) / base.shards[1].file, t1.offset + 10)
    rep = a.receive(2)
    assert rep.delta is not None, rep
    assert [f.split(":")[0] for f in rep.delta.fallbacks] == ["shard 0", "shard 1"], rep.delta.fallbacks
    assert rep.delta.shards == len(base.shards) - 2
    same_bytes(cluster.dir("pub", 2), cluster.dir("a", 2))
    a.release(2)
    rep = b.receive(2)
    assert rep.delta is not None, rep
    assert [f.split(":")[0] for f in rep.delta.fallbacks] == ["shard 1"], rep.delta.fallbacks
    assert rep.delta.shards == len(base.shards) - 1
    same_bytes(cluster.dir("pub", 2), cluster.dir("b", 2))
    for pod in ("a", "b"):
        assert not [p for p in (cluster.base / pod / cluster.job).iterdir() if p.name.startswith(".tmp-v")]
