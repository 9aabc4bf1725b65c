"""Cross-pod weight broadcast: holder servers, pipelined receivers, TCP and RDMA transports.

Callers: every pod's checkpoint engine (`BroadcastNode`), bench/broadcast.py. Modules: base
(interface, errors), select (auto|rdma|tcp → transport, RDMA device discovery), tcp, rdma
(Mooncake), wire (protocol), store (local versions, recycled shard files), server (holder
server), receiver (plan, pull, rename), verify (per-shard checks overlapped with the pull),
deltas (shards as deltas against an older version, delta.py's codec), node (both, for one pod).
"""

from tandem.checkpoint_engine.transport.base import (
    NoSource,
    Peer,
    PeerFailed,
    RdmaUnavailable,
    Transport,
    TransportError,
)
from tandem.checkpoint_engine.transport.node import BroadcastNode
from tandem.checkpoint_engine.transport.receiver import Receiver, ReceiveReport, plan
from tandem.checkpoint_engine.transport.select import make_transport

__all__ = [
    "BroadcastNode",
    "NoSource",
    "Peer",
    "PeerFailed",
    "RdmaUnavailable",
    "ReceiveReport",
    "Receiver",
    "Transport",
    "TransportError",
    "make_transport",
    "plan",
]
