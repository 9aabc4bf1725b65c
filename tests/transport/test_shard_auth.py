"""The holder server's door: only readers proving the job's token get shards, and at most
`max_connections` are served at once. Real TCP on loopback, real shard files, real etcd for the
two-node case; no mocks.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.transport import BroadcastNode, Peer, PeerFailed, TransportError
from tandem.checkpoint_engine.transport.auth import shard_key
from tandem.checkpoint_engine.transport.holder_server import HolderServer
from tandem.checkpoint_engine.transport.store import LocalStore
from tandem.checkpoint_engine.transport.wire import Connection, recv_exact, recv_msg, send_msg
from tandem.checkpoint_engine.versions import layout, version_writer

JOB, TOKEN = "shard-auth", "the-jobs-token"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[HolderServer, version_writer.WriteReport]]:
    """Version 1 (three shards of random bytes) behind a holder server bounded to 2 connections."""
    torch.manual_seed(0)
    tensors = [(f"w{i}", torch.randn(64, 64)) for i in range(3)]
    rep = version_writer.write_version(tmp_path, JOB, 1, tensors, shard_bytes=64 * 64 * 4)
    server = HolderServer(LocalStore(tmp_path, JOB), shard_key(TOKEN, JOB), host="127.0.0.1",
                          max_connections=2).start()
    yield server, rep
    server.close()


def peer(server: HolderServer, token: str) -> Peer:
    return Peer("holder", "127.0.0.1", int(server.port), key=shard_key(token, JOB))


def stream(conn: Connection, shard: int) -> bytes:
    reply = conn.request({"op": "stream", "job": JOB, "v": 1, "shard": shard, "offset": 0})
    return recv_exact(conn.sock, int(reply["total"]))


def test_a_reader_with_the_jobs_token_gets_byte_exact_shards(served: tuple[HolderServer, Any]) -> None:
    server, rep = served
    conn = Connection(peer(server, TOKEN), timeout=10)
    try:
        assert conn.index(JOB, 1, wait=1) == (rep.path / layout.INDEX).read_bytes()
        for i, s in enumerate(rep.index.shards):
            assert stream(conn, i) == (rep.path / s.file).read_bytes()
    finally:
        conn.close()
    assert server.refused == 0


def test_a_reader_without_the_token_is_refused_with_a_clear_error(served: tuple[HolderServer, Any]) -> None:
    server, _ = served
    conn = Connection(peer(server, "another-jobs-token"), timeout=10)
    try:
        with pytest.raises(PeerFailed, match="refused stream: unauthorized: wrong key"):
            stream(conn, 0)
    finally:
        conn.close()
    # a bare client that skips the challenge: refused, then the server closes the connection
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        assert recv_msg(raw)["op"] == "hello"
        send_msg(raw, {"op": "stream", "job": JOB, "v": 1, "shard": 0, "offset": 0})
        reply = recv_msg(raw)
        assert reply["ok"] is False and reply["error"].startswith("unauthorized")
        assert raw.recv(1) == b""
    assert server.refused == 2
    with pytest.raises(ValueError, match="TANDEM_TOKEN"):
        shard_key("", JOB)


def test_connections_beyond_the_bound_wait_until_one_ends(served: tuple[HolderServer, Any]) -> None:
    server, rep = served
    first, second = Connection(peer(server, TOKEN), timeout=10), Connection(peer(server, TOKEN), timeout=10)
    third: Connection | None = None
    try:
        assert stream(first, 0) == stream(second, 0)  # both served
        assert server.active == 2
        with pytest.raises(PeerFailed, match="sent no shard-server challenge"):  # queued: no challenge comes
            Connection(peer(server, TOKEN), timeout=1.5)
        assert server.active == 2
        first.close()  # a slot frees: the next reader is served
        third = Connection(peer(server, TOKEN), timeout=10)
        assert stream(third, 1) == (rep.path / rep.index.shards[1].file).read_bytes()
        assert server.active <= 2
    finally:
        for c in (first, second, third):
            if c is not None:
                c.close()


@pytest.mark.etcd
def test_a_pod_with_another_token_cannot_pull_a_version(
    etcd_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    regs = [SyncRegistry(etcd_server.endpoint, "test", JOB, pod, "rollout", ttl=5, timeout=2.0).connect()
            for pod in ("pub", "thief", "friend")]
    nodes = [BroadcastNode(regs[0], tmp_path / "pub", transport="tcp", bind="127.0.0.1", token=TOKEN).start(),
             BroadcastNode(regs[1], tmp_path / "thief", transport="tcp", bind="127.0.0.1", stall_timeout=1,
                           deadline=3, token="not-the-token").start(),
             BroadcastNode(regs[2], tmp_path / "friend", transport="tcp", bind="127.0.0.1", token=TOKEN).start()]
    try:
        pub = Publisher(tmp_path / "pub", JOB, regs[0], keep=1, shard_bytes=1 << 16)
        published = pub.publish(1, [("w", torch.arange(50_000, dtype=torch.float32))])
        with caplog.at_level(logging.WARNING), pytest.raises(TransportError):
            nodes[1].receive(1)
        assert "unauthorized" in caplog.text
        assert layout.list_versions(tmp_path / "thief", JOB) == []
        got = nodes[2].receive(1)
        for s in layout.read_index(got.path).shards:
            assert (got.path / s.file).read_bytes() == (Path(published.path) / s.file).read_bytes()
    finally:
        for n in nodes:
            n.close()
        for r in regs:
            r.close()
