"""TCP transport: shard bytes stream from the holder server's sendfile into our mapped shard file.

Caller: receiver.py through the `Transport` interface (select.py builds it). On the receiving
side `recv_into` writes straight into the MAP_SHARED mapping of the destination shard file (one
kernel copy, no Python buffer), in chunks, reporting progress after each so that our own
holder server can forward chunk k while chunk k+1 arrives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem.checkpoint_engine.transport.base import Peer, PeerFailed, Progress
from tandem.checkpoint_engine.transport.wire import Connection

CHUNK = 4 << 20


class TcpTransport:
    name = "tcp"

    def __init__(self, chunk: int = CHUNK) -> None:
        self.chunk = chunk
        self.bytes_received = 0

    def advertise(self) -> dict[str, Any]:
        return {}

    def expose(self, path: Path, view: memoryview) -> int:
        return 0

    def unexpose(self, view: memoryview) -> None:
        return None

    def pull(
        self,
        peer: Peer,
        job: str,
        v: int,
        shard: int,
        offset: int,
        dest: memoryview,
        progress: Progress,
        stall_timeout: float,
    ) -> None:
        conn = Connection(peer, timeout=stall_timeout)
        try:
            reply = conn.request({"op": "stream", "job": job, "v": v, "shard": shard, "offset": offset})
            total = int(reply.get("total", -1))
            if total != len(dest):
                raise PeerFailed(
                    f"{peer.pod}: shard {shard} of version {v} has {total} bytes, expected {len(dest)}"
                )
            pos = offset
            sock = conn.sock
            while pos < total:
                try:
                    k = sock.recv_into(dest[pos : min(total, pos + self.chunk)])
                except TimeoutError as e:
                    raise PeerFailed(f"{peer.pod} stalled for {stall_timeout}s in shard {shard}") from e
                except OSError as e:
                    raise PeerFailed(f"{peer.pod}: {e}") from e
                if k == 0:
                    raise PeerFailed(f"{peer.pod} closed the stream of shard {shard} at byte {pos}/{total}")
                pos += k
                self.bytes_received += k
                progress(pos)
        finally:
            conn.close()

    def close(self) -> None:
        return None
