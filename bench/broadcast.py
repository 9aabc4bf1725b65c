"""Benchmark (not a test): 1 sender → N receivers of one weight version, against a plain socket.

Run: `python bench/broadcast.py [--mib 256] [--ns 1,2,4,8] [--transport tcp|mooncake-tcp]`.
Starts a private etcd, publishes a version of random shards in this process (the sender pod,
with its holder server), then for each N starts N receiver processes (each its own shm dir and
holder server), releases them at once and measures the time until the last one holds the
version verified; each N gets a fresh version so earlier receivers are not sources. In the same
run, a plain-socket baseline moves the same bytes process to process (sendall → recv_into a
preallocated buffer). Prints time(N)/time(1) (target: time(8) ≤ 1.25 × time(1)) and the
single-stream throughput against the socket (target ≥ 0.7). On a 2-core machine N=8 receiver
processes plus checksum verification are CPU-bound: the ratios say so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for sub in ("checkpoint_engine", "spec", "sidecars", "operator"):
    sys.path.insert(0, str(ROOT / sub))

import torch  # noqa: E402

from tandem.checkpoint_engine.local_etcd import LocalEtcd  # noqa: E402
from tandem.checkpoint_engine.publisher import Publisher  # noqa: E402
from tandem.checkpoint_engine.sync_registry import SyncRegistry  # noqa: E402
from tandem.checkpoint_engine.transport import BroadcastNode  # noqa: E402
from tandem.checkpoint_engine.transport.base import Transport  # noqa: E402
from tandem.checkpoint_engine.transport.rdma import RdmaTransport  # noqa: E402

JOB = "bench"


def tensors(mib: int, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    n, out = mib << 20, []
    per = 8 << 20
    for i in range(0, n, per):
        out.append((f"w.{i // per}", torch.randint(0, 255, (min(per, n - i),), dtype=torch.uint8, generator=g)))
    return out


def transport_of(kind: str, etcd: str) -> str | Transport:
    return RdmaTransport(host="127.0.0.1", metadata=etcd, protocol="tcp") if kind == "mooncake-tcp" else kind


def child(args: argparse.Namespace) -> None:
    reg = SyncRegistry(args.etcd, "bench", JOB, args.pod, "rollout", ttl=10, timeout=15).connect()
    node = BroadcastNode(reg, Path(args.root), transport=transport_of(args.transport, args.etcd)).start()
    print(json.dumps({"event": "ready"}), flush=True)
    sys.stdin.readline()
    t0 = time.time()
    r = node.receive(args.version)
    done = {"event": "done", "start": t0, "end": time.time(), "verify_s": r.verify_s,
            "transfer_s": r.transfer_s, "upstream": r.upstreams[0], "bytes": r.bytes}
    print(json.dumps(done), flush=True)
    sys.stdin.readline()
    node.close()
    reg.close(revoke=False)


def spawn(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def read_event(p: subprocess.Popen[str]) -> dict[str, object]:
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("{"):
            return dict(json.loads(line))
    raise RuntimeError(f"child exited with {p.wait()}")


def socket_baseline(nbytes: int) -> float:
    """Seconds to move `nbytes` from this process to a child over a plain loopback socket."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    code = (
        "import socket,sys,time\n"
        f"n={nbytes}; buf=bytearray(n); v=memoryview(buf); s=socket.create_connection(('127.0.0.1',{port}))\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4<<20)\n"
        "s.sendall(b'g'); t=time.perf_counter(); got=0\n"
        "while got<n:\n    k=s.recv_into(v[got:]); got+=k\n"
        "print(time.perf_counter()-t)\n"
    )
    data = os.urandom(nbytes)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    conn, _ = srv.accept()
    conn.recv(1)
    conn.sendall(data)
    conn.close()
    out, _ = p.communicate()
    srv.close()
    return float(out.strip())


def wait_etcd(endpoint: str, timeout: float = 60.0) -> None:
    """A just-started etcd accepts TCP before it serves gRPC: wait until a lease can be granted."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reg = SyncRegistry(endpoint, "bench", JOB, "probe", "probe", timeout=5).connect()
            try:
                reg.put_json("/tandem/probe", {}, lease=True)
                return
            finally:
                reg.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--etcd", default="")
    ap.add_argument("--pod", default="")
    ap.add_argument("--root", default="")
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument("--ns", default="1,2,4,8")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    base = Path(tempfile.mkdtemp(prefix="tandem-bc-bench-", dir="/dev/shm"))
    etcd = LocalEtcd(Path(tempfile.mkdtemp(prefix="tandem-bc-etcd-")) / "data").start()
    results: dict[int, float] = {}
    xfers: dict[int, float] = {}
    try:
        wait_etcd(etcd.endpoint)
        reg = SyncRegistry(etcd.endpoint, "bench", JOB, "sender", "trainer", ttl=10, timeout=15).connect()
        node = BroadcastNode(reg, base / "sender", transport=transport_of(args.transport, etcd.endpoint)).start()
        pub = Publisher(base / "sender", JOB, reg, keep=2, shard_bytes=args.shard_mib << 20)
        nbytes = args.mib << 20
        sock_s = min(socket_baseline(nbytes) for _ in range(2))
        print(f"plain socket: {nbytes / sock_s / 1e9:.2f} GB/s ({sock_s:.3f} s for {args.mib} MiB)", flush=True)
        for v, n in enumerate(int(x) for x in args.ns.split(",")):
            version = v + 1
            pub.publish(version, tensors(args.mib, version))
            kids = [
                spawn([sys.executable, __file__, "--child", "--etcd", etcd.endpoint, "--pod", f"r{n}-{i}",
                       "--root", str(base / f"r{n}-{i}"), "--version", str(version), "--transport", args.transport])
                for i in range(n)
            ]
            for k in kids:
                read_event(k)
            t0 = time.time()
            for k in kids:
                assert k.stdin is not None
                k.stdin.write("go\n")
                k.stdin.flush()
            evs = [read_event(k) for k in kids]
            total = max(float(str(e["end"])) for e in evs) - t0
            verify = max(float(str(e["verify_s"])) for e in evs)
            xfer = max(float(str(e["transfer_s"])) for e in evs)
            xfers[n] = xfer
            results[n] = total
            ups = sorted(str(e["upstream"]) for e in evs)
            print(f"N={n}: {total:.3f} s to the last verified receiver ({nbytes / total / 1e9:.2f} GB/s per "
                  f"receiver; bytes moving ≤ {xfer:.3f} s, verify ≤ {verify:.3f} s; first upstreams {ups})", flush=True)
            for k in kids:
                k.communicate("bye\n", timeout=60)
            for i in range(n):
                shutil.rmtree(base / f"r{n}-{i}", ignore_errors=True)
        if 1 in results:
            print(f"single stream vs plain socket: {sock_s / results[1]:.2f}x end to end, "
                  f"{sock_s / xfers[1]:.2f}x bytes moving only (target >= 0.7)")
            for n, t in results.items():
                print(f"time(N={n})/time(N=1) = {t / results[1]:.2f} end to end, "
                      f"{xfers[n] / xfers[1]:.2f} bytes moving" + ("  (target <= 1.25)" if n == 8 else ""))
        node.close()
        reg.close()
    finally:
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
