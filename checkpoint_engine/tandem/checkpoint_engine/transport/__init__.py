"""Cross-pod weight broadcast: holder servers, pipelined receivers, TCP and RDMA transports.

Callers: every pod's checkpoint engine (`BroadcastNode`), bench/broadcast.py. Modules: transport_interface (the
interface, errors, peers), transport_choice (auto|rdma|tcp → transport, RDMA device discovery), tcp, rdma
(Mooncake), wire (protocol), store (local versions, recycled shard files), holder_server (what a pod serves to the
others), receiver (plan, pull, rename), verify (per-shard checks overlapped with the pull), deltas (shards as
deltas against an older version, `..versions.delta`'s codec), node (both, for one pod).
"""

from tandem.checkpoint_engine.transport.node import BroadcastNode
from tandem.checkpoint_engine.transport.receiver import Receiver, ReceiveReport, plan
from tandem.checkpoint_engine.transport.transport_choice import make_transport
from tandem.checkpoint_engine.transport.transport_interface import (
    NoSource,
    Peer,
    PeerFailed,
    RdmaUnavailable,
    Transport,
    TransportError,
)

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
