"""An emulated cluster network on one machine: one network namespace per pod, shaped links.

Callers: tests/transport/test_netns.py and test_shaped_fanout.py (fixtures), bench/broadcast.py
(imports this file). Each pod gets a namespace with an `eth0` veth whose other end sits on a
bridge in the root namespace (the "switch"); the bridge carries the gateway address, where etcd
listens so that every pod reaches it. With `rate` set, both directions of every pod's link are
shaped by `tc tbf` (pod egress on `eth0`, pod ingress on the bridge end): a pod sends and
receives at most `rate`, like a NIC, while the switch itself is not a bottleneck. Addresses come
from 198.18.0.0/15 (reserved for benchmarking networks). `netem` does not exist on this kernel,
so there is no added latency: the tbf queue (`latency`) is the only delay.

Teardown is reliable: `close()` (also on a failed construction, and from `with`) deletes the
namespaces, links and bridge; every network writes a record naming what it created and the pid
that owns it under RECORDS, and `sweep()` (called on each construction) deletes what dead owners
left behind, so a killed bench or test run does not leak interfaces into the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
from pathlib import Path
from types import TracebackType

RECORDS = Path("/run/tandem-emunet")


class NetError(RuntimeError):
    """A namespace, link or qdisc could not be created (not root, no iproute2, no tbf)."""


def _ip(*args: str) -> None:
    _run("ip", *args)


def _run(*argv: str) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise NetError(f"{argv[0]} is not installed") from e
    except subprocess.CalledProcessError as e:
        raise NetError(f"{' '.join(argv)}: {e.stderr.strip()}") from e


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete(namespaces: list[str], links: list[str], bridge: str) -> None:
    """Delete namespaces first (their veth pairs go with them), then the bridge; quiet on absence."""
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for link in [*links, bridge]:
        subprocess.run(["ip", "link", "del", link], capture_output=True)


def sweep() -> list[str]:
    """Delete the networks whose owner process is gone; returns their bridges' names."""
    removed: list[str] = []
    if not RECORDS.is_dir():
        return removed
    for rec in RECORDS.glob("*.json"):
        try:
            data = json.loads(rec.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(data.get("pid", 0))):
            continue
        _delete(list(data.get("namespaces", [])), list(data.get("links", [])), str(data.get("bridge", "")))
        rec.unlink(missing_ok=True)
        removed.append(str(data.get("bridge")))
    return removed


class EmulatedNetwork:
    """A bridge plus one namespace per pod; `addr(pod)`, `exec_prefix(pod)`, `gw` (etcd's host)."""

    def __init__(
        self, pods: list[str], rate: str | None = "1gbit", latency: str = "10ms", burst: str = "256kb"
    ) -> None:
        """`rate`: tc rate of each pod's link in each direction (e.g. "1gbit"), None: unshaped;
        `latency`: how long tbf queues a packet before dropping it (the link's buffer)."""
        if len(set(pods)) != len(pods) or len(pods) > 200:
            raise ValueError(f"pods must be at most 200 distinct names, got {pods}")
        sweep()
        tag = secrets.token_hex(3)
        self.octet = 100 + secrets.randbelow(100)
        self.bridge = f"tb{tag}"
        self.gw = f"198.18.{self.octet}.1"
        self.rate = rate
        self._ns: dict[str, tuple[str, str]] = {}
        self._links: list[str] = []
        self._record = RECORDS / f"{self.bridge}.json"
        try:
            RECORDS.mkdir(parents=True, exist_ok=True)
            self._save()
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gw}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, pod in enumerate(pods):
                self._add_pod(pod, f"tdm{tag}{i}", f"tv{tag}{i}", f"198.18.{self.octet}.{10 + i}", latency, burst)
        except BaseException:
            self.close()
            raise

    def _save(self) -> None:
        rec = {"pid": os.getpid(), "bridge": self.bridge, "links": self._links, "namespaces": self.namespaces}
        self._record.write_text(json.dumps(rec))

    def _add_pod(self, pod: str, ns: str, host_end: str, addr: str, latency: str, burst: str) -> None:
        self._ns[pod] = (ns, addr)
        self._links.append(host_end)
        self._save()  # before creating: a crash in between still leaves a record that names them
        _ip("netns", "add", ns)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", host_end, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        if self.rate:
            shape = ["root", "tbf", "rate", self.rate, "burst", burst, "latency", latency]
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", *shape)  # pod → switch
            _run("tc", "qdisc", "add", "dev", host_end, *shape)  # switch → pod

    @property
    def namespaces(self) -> list[str]:
        return [ns for ns, _ in self._ns.values()]

    @property
    def pods(self) -> dict[str, tuple[str, str]]:
        """pod → (namespace, address), the shape tests/transport/broadcast_pods.Pods takes."""
        return dict(self._ns)

    def addr(self, pod: str) -> str:
        return self._ns[pod][1]

    def exec_prefix(self, pod: str) -> list[str]:
        """Prefix of an argv that runs a command inside `pod`'s namespace."""
        return ["ip", "netns", "exec", self._ns[pod][0]]

    def close(self) -> None:
        _delete(self.namespaces, self._links, self.bridge)
        with contextlib.suppress(OSError):
            self._record.unlink()

    def __enter__(self) -> EmulatedNetwork:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
