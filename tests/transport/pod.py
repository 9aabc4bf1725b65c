"""A "pod" process for the broadcast tests: a publisher or a receiver with its own shm dir.

Callers: tests/transport/test_*.py start it with subprocess (inside a network namespace for the
netns tests). It prints one JSON line per event on stdout
("ready", "done", "error") and keeps serving until its stdin closes or it is killed.

    python tests/transport/pod.py publish --etcd E --job J --pod P --root DIR --version V --mib 64
    python tests/transport/pod.py receive --etcd E --job J --pod P --root DIR --version V
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.transport.node import BroadcastNode
from tandem.checkpoint_engine.transport.rdma import RdmaTransport
from tandem.checkpoint_engine.transport.transport_interface import Transport


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def random_tensors(mib: int, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out, left, i = [], mib << 20, 0
    while left > 0:
        n = min(left, (3 << 20) + 4 * (i % 5) * 1000)  # uneven sizes: padding and shard edges
        out.append((f"layer.{i}.weight", torch.randint(0, 255, (n,), dtype=torch.uint8, generator=g)))
        left -= n
        i += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["publish", "receive"])
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--token", default="test-token", help="the job's token (every pod of a job: the same)")
    ap.add_argument("--pod", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--version", type=int, default=1, help="0: the latest")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--shard-mib", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--advertise", default="127.0.0.1")
    ap.add_argument("--max-rate", type=float, default=0.0, help="bytes/s per served stream (0: none)")
    ap.add_argument("--stall", type=float, default=3.0)
    ap.add_argument("--transport", default="tcp", help="auto|rdma|tcp|mooncake-tcp")
    ap.add_argument("--ttl", type=int, default=5)
    ap.add_argument("--fan", type=int, default=0, help="1: chain, 2: binary tree, 0: by size (receiver.fanout)")
    ap.add_argument("--wait-go", action="store_true", help="receive only after a line on stdin")
    ap.add_argument(
        "--warmup-version",
        type=int,
        default=0,
        help="publish/receive this version first; a receiver then releases it (steady state: the "
        "timed version lands in the recycled pages of the previous one)",
    )
    args = ap.parse_args()

    role = "trainer" if args.role == "publish" else "rollout"
    reg = SyncRegistry(args.etcd, "test", args.job, args.pod, role, ttl=args.ttl, timeout=15).connect()
    transport: str | Transport = args.transport
    if args.transport == "mooncake-tcp":
        transport = RdmaTransport(host=args.advertise, metadata=args.etcd, protocol="tcp")
    node = BroadcastNode(
        reg,
        Path(args.root),
        transport=transport,
        bind=args.bind,
        advertise=args.advertise,
        stall_timeout=args.stall,
        max_rate=args.max_rate or None,
        deadline=120.0,
        token=args.token,
        fan=args.fan or None,
    ).start()
    try:
        if args.role == "publish":
            pub = Publisher(Path(args.root), args.job, reg, keep=4, shard_bytes=args.shard_mib << 20)
            if args.warmup_version:
                pub.publish(args.warmup_version, random_tensors(args.mib, args.seed + 1))
            rep = pub.publish(args.version, random_tensors(args.mib, args.seed))
            emit(event="ready", pod=args.pod, port=node.server.port, path=rep.path, bytes=rep.bytes)
        else:
            if args.warmup_version:
                node.receive(args.warmup_version)
                node.release(args.warmup_version)
            emit(event="ready", pod=args.pod, port=node.server.port)
            if args.wait_go:
                sys.stdin.readline()
            t0 = time.perf_counter()
            try:
                r = node.receive(args.version) if args.version else node.receive_latest()
            except Exception as e:  # reported to the test, which asserts on it
                emit(event="error", pod=args.pod, error=f"{type(e).__name__}: {e}")
                raise SystemExit(1) from e
            emit(
                event="done",
                pod=args.pod,
                path=str(r.path),
                bytes=r.bytes,
                seconds=time.perf_counter() - t0,
                end=time.time(),
                transfer_s=r.transfer_s,
                shard_retries=r.shard_retries,
                upstreams=r.upstreams,
                replans=r.replans,
                verify_s=r.verify_s,
                transport=node.transport.name,
                transport_bytes=getattr(node.transport, "bytes_received", -1),
            )
        sys.stdin.read()  # serve until the test closes our stdin
    finally:
        node.close()
        reg.close()


if __name__ == "__main__":
    main()
