"""The transport interface of the cross-pod weight broadcast, its typed errors and peer records.

Callers: receiver.py pulls byte ranges of shard files through a `Transport`; holder_server.py serves them;
transport_choice.py builds the one transport a node uses (`checkpointEngine.transport`: auto|rdma|tcp).
A transport moves bytes only: planning, verification and etcd bookkeeping are shared by all of
them, so the TCP path exercised on machines without RDMA is the same code path as production.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tandem.checkpoint_engine import errors

if TYPE_CHECKING:
    from tandem.checkpoint_engine.transport.store import ShardDest

if TYPE_CHECKING:
    pass


class TransportError(errors.CheckpointEngineError):
    """A transfer could not be completed (the caller re-plans from etcd)."""

    status_code = 503
    code = "transport_error"


class PeerFailed(TransportError):
    """A peer refused, closed, stalled or answered nonsense; another source should be tried."""

    code = "peer_failed"


class NoSource(TransportError):
    """No live pod holds (or is receiving) the version: nothing to pull from."""

    code = "no_source"


class RdmaUnavailable(TransportError):
    """RDMA was asked for explicitly but this machine has no RDMA device or no RDMA library."""

    code = "rdma_unavailable"


@dataclass(frozen=True)
class Peer:
    """A pod's holder server as published in etcd under keys.transport_endpoint, and the key a
    reader answers its challenge with (`auth.shard_key`: never published, set by the reader)."""

    pod: str
    host: str
    port: int
    transports: tuple[str, ...] = ("tcp",)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    key: bytes = field(default=b"", compare=False, hash=False, repr=False)

    def record(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "host": self.host,
            "port": self.port,
            "transports": list(self.transports),
            **self.extra,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any], key: bytes = b"") -> Peer:
        try:
            extra = {k: v for k, v in rec.items() if k not in ("pod", "host", "port", "transports")}
            return cls(str(rec["pod"]), str(rec["host"]), int(rec["port"]), tuple(rec["transports"]), extra, key)
        except (KeyError, TypeError, ValueError) as e:
            raise PeerFailed(f"malformed transport endpoint record {rec!r}: {e}") from e


Progress = Callable[[int], None]
"""Called with the new count of bytes present at the destination (from its start) after each chunk."""


class Transport(Protocol):
    """Moves byte ranges of a peer's shard files into local memory.

    `pull` copies shard `shard` of version `v` from `peer`, bytes [offset, dest.nbytes), into
    `dest` (the local shard file: its fd, and a map of it on demand), calling
    `progress` as bytes land. It raises PeerFailed when the peer dies, stalls for
    `stall_timeout` seconds, or refuses; bytes already delivered stay valid (the caller resumes
    from the last progress value with another peer).
    """

    name: str
    needs_memory: bool  # peers read our shard maps directly (RDMA): the receiver maps and exposes them

    def advertise(self) -> dict[str, Any]:
        """Extra fields for this node's endpoint record (e.g. a transfer-engine segment name)."""
        ...

    def expose(self, path: Path, view: memoryview) -> int:
        """Make a local shard mapping readable by peers; returns the address peers read it at
        (RDMA registers the memory; TCP: no-op, 0)."""
        ...

    def unexpose(self, view: memoryview) -> None: ...

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
    ) -> None: ...

    def close(self) -> None: ...
