"""RDMA transport on Mooncake's Transfer Engine: one-sided reads of a peer's registered shard maps.

Callers: transport_choice.py builds it when an RDMA device exists (protocol "rdma"); tests and the bench
build it with protocol "tcp" (Mooncake's own TCP protocol), which runs on machines without RDMA
and goes through this very class. Control stays on the holder server's TCP protocol (wire.py
`avail`: how many bytes of a shard the peer has, and where they live in its registered memory);
the bytes move by `transfer_sync_read` into our registered destination map, chunk by chunk.

Mooncake traps handled here: every buffer is registered (RDMA needs it, TCP does not check);
the segment name is fresh per process (host:<free port>), since a restarted engine under an old
name would be served stale buffer addresses; asking for "rdma" without a device silently uses
TCP, so transport_choice.py only asks for it when it found a device; its etcd keys carry no
lease: `close()` unregisters them, and a crashed process leaves one stale `mooncake/*/<name>`
entry that no plan refers to (names are never reused).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tandem.checkpoint_engine.etcd.endpoints import parse_endpoint
from tandem.checkpoint_engine.etcd.local_etcd import free_port
from tandem.checkpoint_engine.transport.transport_interface import Peer, PeerFailed, Progress, RdmaUnavailable
from tandem.checkpoint_engine.transport.wire import Connection

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tandem.checkpoint_engine.transport.store import ShardDest

CHUNK = 16 << 20


def mooncake_available() -> bool:
    """Whether Mooncake's engine imports (it needs libibverbs.so.1 even for its TCP protocol)."""
    try:
        # torch first: it loads libcudart.so.13, which the CUDA build's engine.so needs but does not find
        # through its own rpath (the library lives in torch's nvidia/cu13 wheel)
        importlib.import_module("torch")
        import mooncake.engine  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def hcas(topology: str) -> list[str]:
    """The HCA names in Mooncake's `get_local_topology()` JSON ({location: [[preferred], [available]]})."""
    try:
        parsed = json.loads(topology)
    except ValueError:
        return []
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, str):
            found.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    if isinstance(parsed, dict):
        for lists in parsed.values():
            walk(lists)
    return sorted(set(found))


def address_of(view: memoryview) -> int:
    """Address of a writable buffer (a map of a shard file)."""
    if len(view) == 0:
        return 0
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class RdmaTransport:
    name = "rdma"
    needs_memory = True

    def __init__(self, host: str, metadata: str, protocol: str = "rdma", device: str = "", chunk: int = CHUNK) -> None:
        if not mooncake_available():
            raise RdmaUnavailable(
                "the Mooncake transfer engine is not importable "
                "(pip mooncake-transfer-engine[-non-cuda]; it needs libibverbs1)"
            )
        from mooncake.engine import TransferEngine

        etcd_host, etcd_port = parse_endpoint(metadata)
        self.protocol, self.chunk = protocol, chunk
        self.segment = f"{host}:{free_port()}"
        self.engine: Any = TransferEngine()
        rc = self.engine.initialize(self.segment, f"etcd://{etcd_host}:{etcd_port}", protocol, device)
        if rc != 0:
            raise RdmaUnavailable(f"Mooncake initialize({self.segment}, {protocol}) returned {rc}")
        if protocol == "rdma" and not hcas(self.engine.get_local_topology()):
            raise RdmaUnavailable(f"Mooncake found no usable HCA among {device or 'the listed devices'} (its topology "
                                  "lists none) and would quietly move every shard over TCP")
        self._regs: dict[int, int] = {}
        self._lock = threading.Lock()
        self.bytes_received = 0

    def advertise(self) -> dict[str, Any]:
        return {"segment": self.segment, "protocol": self.protocol}

    def expose(self, path: Path, view: memoryview) -> int:
        addr = address_of(view)
        if addr == 0:
            return 0
        with self._lock:
            if addr in self._regs:
                return addr
            rc = self.engine.register_memory(addr, len(view))
            if rc != 0:
                raise RdmaUnavailable(f"cannot register {len(view)} bytes of {path} with Mooncake (rc {rc})")
            self._regs[addr] = len(view)
        return addr

    def unexpose(self, view: memoryview) -> None:
        addr = address_of(view)
        with self._lock:
            if self._regs.pop(addr, None) is not None:
                self.engine.unregister_memory(addr)

    def pull(
        self,
        peer: Peer,
        job: str,
        v: int,
        shard: int,
        offset: int,
        dest: ShardDest,
        progress: Progress,
        stall_timeout: float,
    ) -> None:
        segment = peer.extra.get("segment")
        if not isinstance(segment, str):
            raise PeerFailed(f"{peer.pod} advertises no Mooncake segment")
        local = self.expose(Path("<dest>"), dest.view())
        total = dest.nbytes
        conn = Connection(peer, timeout=stall_timeout + 5)
        try:
            pos = offset
            while pos < total:
                want = min(total, pos + self.chunk)
                reply = conn.request(
                    {
                        "op": "avail",
                        "job": job,
                        "v": v,
                        "shard": shard,
                        "at_least": want,
                        "wait": stall_timeout,
                    }
                )
                avail, remote = int(reply.get("avail", 0)), int(reply.get("addr", 0))
                if int(reply.get("total", -1)) != total:
                    raise PeerFailed(f"{peer.pod}: shard {shard} size differs ({reply.get('total')} != {total})")
                if avail <= pos or remote == 0:
                    raise PeerFailed(f"{peer.pod} stalled for {stall_timeout}s in shard {shard}")
                n = min(avail, want) - pos
                rc = self.engine.transfer_sync_read(segment, local + pos, remote + pos, n)
                if rc != 0:
                    raise PeerFailed(f"Mooncake read of {n} bytes from {peer.pod} failed (rc {rc})")
                pos += n
                self.bytes_received += n
                progress(pos)
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            regs, self._regs = dict(self._regs), {}
        for addr in regs:
            try:
                self.engine.unregister_memory(addr)
            except Exception as e:  # the engine may already be shutting down
                log.debug("unregister failed: %s", e)
