"""Fan-out on an emulated cluster network: every pod in its own namespace, links shaped by tc tbf.

One publisher and five receivers, released one after another, form a pipelined chain; a mid-chain receiver is
killed while bytes flow through it, and every other receiver still ends with the version
bit-exact (the one after it closes the chain over the gap and resumes at the byte it had). Then
a complete holder's copy is corrupted on disk and a late joiner whose plan puts that holder
first still ends bit-exact: the corrupt shard fails its checks and is pulled again elsewhere,
without restarting the rest. Skipped, saying why, where namespaces cannot be created (not root).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from broadcast_pods import Pod, Pods, same_bytes, wait_for
from emunet import EmulatedNetwork, NetError

from tandem.checkpoint_engine.etcd.local_etcd import LocalEtcd
from tandem.checkpoint_engine.transport import plan
from tandem.checkpoint_engine.versions import layout

RECEIVERS = [f"r{i}" for i in range(5)]
VICTIM = "r2"
HOLDERS = ["pub", *(r for r in RECEIVERS if r != VICTIM)]
CORRUPT = "r1"
# a late joiner's plan (no chain running) is the holders in an order hashed from its name:
LATE = next(n for n in (f"late{i}" for i in range(100)) if plan(n, [], HOLDERS, set())[0] == CORRUPT)
# 48 MiB over 200 Mbit/s links: about 2 s per hop-pipelined transfer, time to kill a pod mid-way
ARGS = ("--mib", "48", "--shard-mib", "16", "--stall", "3")


@pytest.fixture
def net() -> Iterator[EmulatedNetwork]:
    try:
        n = EmulatedNetwork(["pub", *RECEIVERS, LATE], rate="200mbit")
    except NetError as e:
        pytest.skip(f"cannot create network namespaces or tbf qdiscs here ({e})")
    try:
        yield n
    finally:
        n.close()


def _has_bytes_at(pod: Pod, job: str, offset: int) -> bool:
    """Whether `pod`'s incoming copy of version 1 already holds data at `offset` of shard 0."""
    for tmp in layout.job_dir(pod.root, job).glob(".tmp-v*"):
        f = tmp / "shard-00000.bin"
        try:
            with open(f, "rb") as fh:
                fh.seek(offset)
                return any(fh.read(4096))
        except OSError:
            continue
    return False


@pytest.mark.etcd
def test_shaped_fanout_survives_a_killed_source_and_a_corrupt_one(
    net: EmulatedNetwork, bridge_etcd: LocalEtcd, shm_base: Path
) -> None:
    pods = Pods(bridge_etcd.endpoint, shm_base, netns=net.pods)
    try:
        pub = pods.start("publish", "pub", *ARGS)
        assert pub.event(120)["event"] == "ready"
        rs = {name: pods.start("receive", name, "--wait-go", *ARGS) for name in RECEIVERS}
        for r in rs.values():
            assert r.event(120)["event"] == "ready"
        for name, r in rs.items():  # one after another: the chain is the join order, so the victim
            r.go()                      # is mid-chain with receivers streaming from it when it dies
            wait_for(lambda r=r: _has_bytes_at(r, pods.job, 0), 60, f"{name} receiving")
        wait_for(lambda: _has_bytes_at(rs[VICTIM], pods.job, 8 << 20), 60, f"{VICTIM} holding 8 MiB")
        rs[VICTIM].kill()  # mid-transfer: the receivers after it stream from it
        evs = {name: rs[name].event(120) for name in RECEIVERS if name != VICTIM}
        ref = pods.version_dir(pub)
        for name, ev in evs.items():
            assert ev["event"] == "done", ev
            same_bytes(ref, pods.version_dir(rs[name]))
        replanned = [ev for ev in evs.values() if VICTIM in ev["upstreams"]]
        assert replanned and all(ev["replans"] >= 1 for ev in replanned), evs
        assert any(up.startswith("r") for ev in evs.values() for up in ev["upstreams"]), evs  # a chain

        shard = pods.version_dir(rs[CORRUPT]) / "shard-00000.bin"
        with open(shard, "r+b") as fh:  # a holder's memory goes bad after it verified its copy
            fh.seek(5 << 20)
            data = fh.read(4096)
            fh.seek(5 << 20)
            fh.write(bytes(b ^ 0xFF for b in data))
        late = pods.start("receive", LATE, *ARGS)
        assert late.event(120)["event"] == "ready"
        ev = late.event(120)
        assert ev["event"] == "done", ev
        live = [up for up in ev["upstreams"] if up != VICTIM]  # its receiving key may outlive it a while
        assert live[0] == CORRUPT and len(live) >= 2 and ev["shard_retries"] >= 1, ev
        same_bytes(ref, pods.version_dir(late))
    finally:
        pods.close()
