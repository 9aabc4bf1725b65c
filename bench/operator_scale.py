"""Operator scale benchmark: 100 RLHFJobs created at once on the real control plane.

Measures, per job, the seconds from its create call returning to the moment all its pods exist
(seen on a pod watch), and prints p50/p99/max, the time until every job reports Running, and the
operator's CPU seconds and peak RSS (psutil, /proc VmHWM). Target: p99 <= 2 s. Not a test.

Run: /root/.cache/tandem/venv/bin/python bench/operator_scale.py [--jobs 100] [--pods-per-job 2]
Needs the binaries of scripts/build-k8s.sh. The operator runs as a subprocess with the chart
ServiceAccount's token, exactly as in tests/operator.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config, watch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(ROOT / "tests" / "operator"),
    *(str(ROOT / r) for r in ("operator", "sidecars", "checkpoint_engine")),
]

from controlplane import ControlPlane, free_port, missing_binaries  # noqa: E402
from harness import MANIFESTS, OperatorProcess, namespace_doc, service_account_kubeconfig  # noqa: E402
from wrappers import JobWrapper  # noqa: E402

NS = "bench"


def start_etcd(cp: ControlPlane) -> tuple[subprocess.Popen[bytes], str]:
    port, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            str(cp.bin_dir / "etcd"),
            "--data-dir",
            str(cp.root / "bench-etcd"),
            "--name",
            "bench",
            "--listen-client-urls",
            url,
            "--advertise-client-urls",
            url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"bench=http://127.0.0.1:{peer}",
            "--log-level",
            "error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, url


class PodWatch(threading.Thread):
    """Records when each pod of the namespace is first seen."""

    def __init__(self, core: client.CoreV1Api):
        super().__init__(daemon=True)
        self.core, self.stop_flag = core, threading.Event()
        self.seen: dict[str, float] = {}
        self.ready = threading.Event()

    def run(self) -> None:
        w = watch.Watch()
        rv = self.core.list_namespaced_pod(NS).metadata.resource_version
        self.ready.set()
        while not self.stop_flag.is_set():
            for ev in w.stream(self.core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=5):
                obj: Any = ev["object"]
                rv = obj.metadata.resource_version
                self.seen.setdefault(obj.metadata.name, time.monotonic())
                if self.stop_flag.is_set():
                    break


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(jobs: int, rollout_only: int, interval: float) -> None:
    cp = ControlPlane(nodes=4)
    etcd: subprocess.Popen[bytes] | None = None
    op: OperatorProcess | None = None
    try:
        t0 = time.monotonic()
        cp.start()
        print(f"control plane up in {time.monotonic() - t0:.1f}s")
        cp.kubectl("apply", "-f", str(MANIFESTS / "tandem.yaml"))
        cp.kubectl("wait", "--for=condition=Established", "crd/rlhfjobs.tandem.dev", "--timeout=60s")
        cp.apply(namespace_doc(NS))
        sa = service_account_kubeconfig(cp, cp.root / "sa.kubeconfig")
        etcd, etcd_url = start_etcd(cp)
        op = OperatorProcess(sa, etcd_url, cp.root / "operator.log", interval, verbose=False).start()
        proc = psutil.Process(op.pid)
        api = config.new_client_from_config(str(cp.kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        time.sleep(5)  # let the operator list, index and settle
        cpu0 = sum(proc.cpu_times()[:2])

        watcher = PodWatch(core)
        watcher.start()
        watcher.ready.wait(30)
        docs = [JobWrapper(f"job-{i:03d}", NS).small().rollout_only(rollout_only).obj() for i in range(jobs)]
        created: dict[str, float] = {}

        def create(doc: dict[str, Any]) -> None:
            custom.create_namespaced_custom_object("tandem.dev", "v1alpha1", NS, "rlhfjobs", doc)
            created[doc["metadata"]["name"]] = time.monotonic()

        start = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, docs))
        print(f"{jobs} RLHFJobs created in {time.monotonic() - start:.2f}s")
        per_job = 1 + rollout_only
        expected = {
            d["metadata"]["name"]: [f"{d['metadata']['name']}-{i}" for i in range(per_job)] for d in docs
        }
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(watcher.seen) < jobs * per_job:
            time.sleep(0.1)
        latencies = [
            max(watcher.seen[p] for p in pods) - created[j]
            for j, pods in expected.items()
            if all(p in watcher.seen for p in pods)
        ]
        all_pods = time.monotonic() - start
        cpu_pods = sum(proc.cpu_times()[:2]) - cpu0

        def running() -> int:
            items = custom.list_namespaced_custom_object("tandem.dev", "v1alpha1", NS, "rlhfjobs")["items"]
            return sum(1 for it in items if (it.get("status") or {}).get("phase") == "Running")

        while time.monotonic() < deadline and running() < jobs:
            time.sleep(0.5)
        all_running = time.monotonic() - start
        cpu_total = sum(proc.cpu_times()[:2]) - cpu0
        peak = int(
            next(
                line.split()[1]
                for line in Path(f"/proc/{op.pid}/status").read_text().splitlines()
                if line.startswith("VmHWM")
            )
        )
        watcher.stop_flag.set()
        print(f"jobs with all pods created: {len(latencies)}/{jobs} ({jobs * per_job} pods)")
        if latencies:
            print(
                f"create -> all pods created: p50 {statistics.median(latencies):.3f}s  "
                f"p99 {percentile(latencies, 0.99):.3f}s  max {max(latencies):.3f}s  (target p99 <= 2 s)"
            )
        print(
            f"all pods of all jobs exist after {all_pods:.2f}s; "
            f"all {jobs} jobs Running after {all_running:.2f}s ({running()} Running)"
        )
        print(
            f"operator CPU: {cpu_pods:.2f}s until all pods existed, {cpu_total:.2f}s until all Running; "
            f"peak RSS {peak / 1024:.1f} MiB (reconcile interval {interval}s)"
        )
    finally:
        if op is not None:
            op.stop()
        if etcd is not None:
            etcd.terminate()
            etcd.wait(10)
        cp.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument(
        "--rollout-only", type=int, default=1, help="rollout-only pods per job (plus 1 hybrid pod)"
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, help="operator reconcile interval (chart default 2)"
    )
    args = parser.parse_args()
    missing = missing_binaries()
    if missing:
        print(f"missing {missing}: run scripts/build-k8s.sh", file=sys.stderr)
        return 1
    run(args.jobs, args.rollout_only, args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
