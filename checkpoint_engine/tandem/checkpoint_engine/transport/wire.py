"""Framing of the holder servers' control/data protocol over TCP, and a blocking client for it.

Callers: holder_server.py (answers), tcp.py (streams shard bytes), receiver.py (fetches a version's
index), rdma.py (asks how many bytes of a shard a peer already has).

Every request and every reply header is a 4-byte big-endian length followed by a JSON object.
Requests: {"op": "index", "job", "v"} → header {"ok", "length"} + the index.json bytes;
{"op": "stream", "job", "v", "shard", "offset"} → header {"ok", "total"} + bytes
[offset, total) of the shard, sent as they become available (a receiver re-serves what it has);
{"op": "avail", "job", "v", "shard", "at_least", "wait"} → header {"ok", "avail", "total"};
{"op": "delta", "job", "v", "base", "shard"} → header {"ok", "length"} + a delta.py payload.
A refusal is {"ok": false, "error": "..."}. Before any request the server challenges the
connection and the client answers with its key (auth.py); a reader without the job's key gets
"unauthorized" as the refusal of its first request.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from tandem.checkpoint_engine.transport import auth
from tandem.checkpoint_engine.transport.transport_interface import Peer, PeerFailed

_LEN = struct.Struct(">I")
MAX_HEADER = 1 << 20


def send_msg(sock: socket.socket, msg: dict[str, Any]) -> None:
    body = json.dumps(msg).encode()
    sock.sendall(_LEN.pack(len(body)) + body)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return bytes(buf)


def recv_msg(sock: socket.socket) -> dict[str, Any]:
    (n,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    if n > MAX_HEADER:
        raise ConnectionError(f"header of {n} bytes is too large")
    msg = json.loads(recv_exact(sock, n))
    if not isinstance(msg, dict):
        raise ConnectionError("header is not a JSON object")
    return msg


class Connection:
    """One TCP connection to a peer's holder server, authenticated with `peer.key` (auth.py);
    requests run one after another on it."""

    def __init__(self, peer: Peer, timeout: float) -> None:
        self.peer = peer
        try:
            self.sock = socket.create_connection((peer.host, peer.port), timeout=timeout)
        except OSError as e:
            raise PeerFailed(f"cannot connect to {peer.pod} at {peer.host}:{peer.port}: {e}") from e
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:  # the server speaks first (a server at its connection bound has not accepted us yet)
            hello = recv_msg(self.sock)
            nonce = bytes.fromhex(str(hello["nonce"]))
            send_msg(self.sock, {"op": "auth", "mac": auth.answer(peer.key, nonce)})
        except (OSError, KeyError, ValueError) as e:
            self.close()
            raise PeerFailed(f"{peer.pod} at {peer.host}:{peer.port} sent no shard-server challenge: {e}") from e

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        try:
            send_msg(self.sock, msg)
            reply = recv_msg(self.sock)
        except (OSError, ValueError) as e:
            raise PeerFailed(f"{self.peer.pod}: {msg.get('op')} failed: {e}") from e
        if not reply.get("ok"):
            raise PeerFailed(f"{self.peer.pod} refused {msg.get('op')}: {reply.get('error')}")
        return reply

    def index(self, job: str, v: int, wait: float) -> bytes:
        reply = self.request({"op": "index", "job": job, "v": v, "wait": wait})
        try:
            return recv_exact(self.sock, int(reply["length"]))
        except (OSError, KeyError, ValueError) as e:
            raise PeerFailed(f"{self.peer.pod}: index of version {v} cut off: {e}") from e

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
