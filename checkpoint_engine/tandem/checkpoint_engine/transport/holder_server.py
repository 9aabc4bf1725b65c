"""Holder server: serves a pod's versions (complete or still arriving) to other pods' receivers.

Callers: node.py starts one per pod (trainer pods serve what their publisher wrote, rollout pods
re-serve what they received). One thread per connection, at most `max_connections` at once (the
accept loop waits for a free slot, so excess connections wait in the listen backlog and get no
challenge until one ends; an idle connection gives its slot back after `idle_timeout`). Every
connection must first answer a challenge with the job's key (auth.py), or is refused and closed.
Shard bytes leave by `os.sendfile` from the shm file (no copy through Python), as soon as they
are present: a receiver's own downstream streams from it while it is still receiving (wire.py
holds the protocol).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
import time
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.transport import auth, wire
from tandem.checkpoint_engine.transport.deltas import DeltaSource
from tandem.checkpoint_engine.transport.store import LocalStore
from tandem.checkpoint_engine.transport.transport_interface import Transport
from tandem.checkpoint_engine.versions import layout

log = logging.getLogger(__name__)

SLICE = 4 << 20
MAX_CONNECTIONS = 64


class HolderServer:
    def __init__(
        self,
        store: LocalStore,
        key: bytes,
        host: str = "0.0.0.0",
        port: int = 0,
        wait_timeout: float = 30.0,
        max_rate: float | None = None,
        transport: Transport | None = None,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = 120.0,
    ) -> None:
        """`key`: the job's shard key (`auth.shard_key`), which every connection must prove;
        `port`: 0 picks a free one; `wait_timeout`: how long a stream waits for bytes that have
        not arrived yet; `max_rate`: optional cap in bytes/s per stream (leaves bandwidth to other
        traffic); `max_connections`: connections served at once; `idle_timeout`: seconds a
        connection may wait between requests before it is closed."""
        if not key:
            raise ValueError("a holder server needs the job's shard key (auth.shard_key)")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, not {max_connections}")
        self.key = key
        self.store, self.wait_timeout, self.max_rate = store, wait_timeout, max_rate
        self.idle_timeout, self.max_connections = idle_timeout, max_connections
        self.transport = transport  # answers `avail` with registered addresses (RDMA)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            raise OSError(e.errno, f"shard server cannot listen on {host}:{port}: {e.strerror}") from e
        self.sock.listen(64)
        self.host, self.port = self.sock.getsockname()[:2]
        self._slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0  # connections that failed the challenge
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="holder-server", daemon=True)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.deltas = DeltaSource(store)  # answers "delta" (deltas.py)

    def start(self) -> HolderServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    @property
    def active(self) -> int:
        """Connections being served now."""
        with self._lock:
            return len(self._conns)

    def _accept(self) -> None:
        while not self._stop.is_set():
            if not self._slots.acquire(timeout=0.5):  # all slots busy: the next client waits in the backlog
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                self._slots.release()
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # a receiver that stops reading makes sendfile fail after this long instead of hanging;
            # one that sends no request for idle_timeout gives its slot back
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(self.wait_timeout), 0))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(self.idle_timeout), 0))
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="holder-conn", daemon=True).start()

    def _admit(self, conn: socket.socket) -> bool:
        """The challenge (auth.py): True when the client proved the job's key."""
        nonce = auth.challenge()
        wire.send_msg(conn, {"op": "hello", "nonce": nonce.hex()})
        why = auth.refusal(self.key, nonce, wire.recv_msg(conn))
        if why is None:
            return True
        self.refused += 1
        log.warning("shard server refused a connection: %s", why)
        wire.send_msg(conn, {"ok": False, "error": why})
        return False

    def _serve(self, conn: socket.socket) -> None:
        try:
            try:
                if not self._admit(conn):
                    _drain(conn)
                    return
            except (ConnectionError, OSError, ValueError):
                return
            while not self._stop.is_set():
                try:
                    req = wire.recv_msg(conn)
                except (ConnectionError, OSError, ValueError):
                    return
                try:
                    self._handle(conn, req)
                except errors.CheckpointEngineError as e:
                    wire.send_msg(conn, {"ok": False, "error": f"{e.code}: {e}"})
        except OSError as e:
            log.debug("connection ended: %s", e)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            self._slots.release()

    def _check_job(self, req: dict[str, Any]) -> int:
        if req.get("job") != self.store.job:
            raise errors.VersionNotFound(f"this server holds job {self.store.job!r}, not {req.get('job')!r}")
        return int(req["v"])

    def _handle(self, conn: socket.socket, req: dict[str, Any]) -> None:
        op = req.get("op")
        if op == "ping":
            wire.send_msg(conn, {"ok": True, "job": self.store.job})
            return
        v = self._check_job(req)
        if op == "index":
            raw = self._index(v, float(req.get("wait", self.wait_timeout)))
            wire.send_msg(conn, {"ok": True, "length": len(raw)})
            conn.sendall(raw)
        elif op == "stream":
            self._stream(conn, v, int(req["shard"]), int(req["offset"]))
        elif op == "avail":
            self._avail(conn, v, int(req["shard"]), int(req["at_least"]), float(req.get("wait", 0)))
        elif op == "delta":  # shard of v encoded against base version `base` (both complete here)
            payload = self.deltas.payload(v, int(req["base"]), int(req["shard"]))
            wire.send_msg(conn, {"ok": True, "length": len(payload)})
            conn.sendall(payload)
            self.bytes_sent += len(payload)
        else:
            raise errors.UnsupportedOperation(f"unknown op {op!r}")

    def _index(self, v: int, wait: float) -> bytes:
        path = self.store.complete_dir(v)
        if path is not None:
            return (path / layout.INDEX).read_bytes()
        inc = self.store.incoming(v)
        if inc is None:
            raise errors.VersionNotFound(f"version {v} is not here")
        return inc.wait_index(min(wait, self.wait_timeout))

    def _stream(self, conn: socket.socket, v: int, shard: int, offset: int) -> None:
        inc = self.store.incoming(v)
        path = self.store.complete_dir(v)
        if inc is not None and not inc.done:
            inc.wait_index(self.wait_timeout)
            idx = inc.index
            if idx is None or not 0 <= shard < len(idx.shards):
                raise errors.VersionNotFound(f"version {v} has no shard {shard}")
            total = idx.shards[shard].nbytes
            wire.send_msg(conn, {"ok": True, "total": total})
            fd, pos = inc.fds[shard], offset
            while pos < total:
                try:
                    avail = inc.wait_avail(shard, pos, self.wait_timeout)
                except errors.CheckpointEngineError as e:  # mid-stream: only closing can tell
                    raise OSError(str(e)) from e
                if avail <= pos:
                    raise OSError(f"no new bytes of version {v} shard {shard} for {self.wait_timeout}s")
                self._send(conn, fd, pos, avail - pos)
                pos = avail
            return
        if path is None:
            raise errors.VersionNotFound(f"version {v} is not here")
        index = layout.read_index(path)
        if not 0 <= shard < len(index.shards):
            raise errors.VersionNotFound(f"version {v} has no shard {shard}")
        total = index.shards[shard].nbytes
        fd = os.open(path / index.shards[shard].file, os.O_RDONLY)
        try:
            wire.send_msg(conn, {"ok": True, "total": total})
            self._send(conn, fd, offset, total - offset)
        finally:
            os.close(fd)

    def _avail(self, conn: socket.socket, v: int, shard: int, at_least: int, wait: float) -> None:
        inc = self.store.incoming(v)
        if inc is not None and not inc.done:
            inc.wait_index(min(wait, self.wait_timeout))
            avail = inc.wait_avail(shard, at_least - 1, min(wait, self.wait_timeout))
            total = inc.index.shards[shard].nbytes if inc.index is not None else 0
            addr = inc.addrs[shard] if shard < len(inc.addrs) else 0
        else:
            f, view = self.store.complete_view(v, shard)
            total = avail = len(view)
            addr = self.transport.expose(f, view) if self.transport is not None else 0
        wire.send_msg(conn, {"ok": True, "avail": avail, "total": total, "addr": addr})

    def _send(self, conn: socket.socket, fd: int, pos: int, n: int) -> None:
        """sendfile `n` bytes of `fd` from `pos` (paced when `max_rate` is set)."""
        t0, sent = time.monotonic(), 0
        while sent < n:
            k = os.sendfile(conn.fileno(), fd, pos + sent, min(n - sent, SLICE))
            if k == 0:
                raise OSError("shard file ended early")
            sent += k
            self.bytes_sent += k
            if self.max_rate:
                ahead = sent / self.max_rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)


def _drain(conn: socket.socket, seconds: float = 1.0) -> None:
    """Read and drop what a refused client already sent, so closing does not reset the connection
    before it has read the refusal (a reset would hide the reason)."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(seconds)
        while conn.recv(1 << 16):
            pass
