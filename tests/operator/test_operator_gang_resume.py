"""A gang restart resumes training from the durable copy: real operator, real API server, real sidecars.

The simulated kwok nodes run no containers, so the test plays the kubelet for one job: it reads the
pods the operator created (and the job's ConfigMap and Secret) from the API server and starts their
containers as local processes with `tandem.cli.local.processes_for` (what `tandem run` uses), each
pod with its own shared-memory directory (the emptyDir) and the hostPath volume honoured as a bind
mount would. Then a pod fails: the test kills generation 0's processes, deletes their shared memory
(a deleted pod's emptyDir goes with it) and marks the pod Failed; the operator restarts the gang
(generation 1), whose driver must resume from the durable copy on the volume — the iteration and the
weights after it — and the job finishes Succeeded with one restart.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane
from harness import OperatorProcess, get_json, wait_for
from test_monitoring import families
from test_operator_cluster import create, fail_pod, phase_is, running
from wrappers import JobWrapper

from tandem.checkpoint_engine.versions import layout
from tandem.checkpoint_engine.versions.durable import DurableStore
from tandem.cli.local import processes_for
from tandem.cli.local_procs import LocalContainer
from tandem.cli.volumes import localize
from tandem.spec.load import parse_job

pytestmark = [pytest.mark.k8s, pytest.mark.e2e, pytest.mark.vllm, pytest.mark.megatron, pytest.mark.etcd]

# generation 0 is frozen after its 2nd copy (killed after its 3rd row in the kept-pod test), several iterations
# (seconds) before its last; generation 1 runs the rest (the first test's asserts `saved.iteration < ITERATIONS`)
ITERATIONS = 8


@pytest.fixture(autouse=True)
def no_shm_left() -> Iterator[None]:
    """This test SIGKILLs whole pods, vLLM included, as a node loss would; in a cluster the pod's
    /dev/shm goes with it, here the segments those vLLMs mapped (psm_*) are removed after the test
    once no live process maps them."""
    import psutil

    from tandem.sidecars.rollout_engine.procs import SHM, shm_segments

    before = {f.name for f in SHM.glob("psm_*")}
    yield
    mapped = set().union(*(shm_segments(pid) for pid in psutil.pids()))
    for f in SHM.glob("psm_*"):
        if f.name not in before and f.name not in mapped:
            f.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def toy() -> Path:
    from tandem.sidecars.toy.build import build_toy

    root = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "test-toy"
    return build_toy(root, seed=0, warmup_steps=40, max_operand=10).root


def job_doc(name: str, ns: str, toy: Path, volume: Path) -> dict[str, Any]:
    return (
        JobWrapper(name, ns).small()
        .set("model", {"path": str(toy / "model")})
        .set("dataset", {"path": str(toy / "train.jsonl")})
        .set("algorithm", {"name": "grpo", "groupSize": 8, "lr": 3.0e-3, "iterations": ITERATIONS})
        .set("trainer.globalBatchSize", 128).set("trainer.microBatchSize", 16)
        .set("rollout.maxTokens", 12).set("rollout.promptsPerIteration", 4).set("rollout.betweenRollouts", "keep")
        .set("rewards", [{"type": "answerMatch"}, {"type": "format", "pattern": "<answer>-?[0-9]+</answer>",
                                                  "weight": 0.1}])
        .set("checkpointEngine.transport", "tcp").set("checkpointEngine.shardSizeMiB", 64)
        .set("volumes", [{"name": "ckpt", "mountPath": "/ckpt", "hostPath": str(volume)}])
        .set("checkpointEngine.persist", {"path": "/ckpt/tandem", "every": 1, "keep": 2})
        .set("failurePolicy", {"maxRestarts": 1, "backoffSeconds": 1})
        .doc
    )


class Kubelet:
    """Runs one generation of a job's pods, as the API server holds them, as local processes."""

    def __init__(self, cp: ControlPlane, ns: str, name: str, etcd: str, workdir: Path) -> None:
        self.cp, self.ns, self.name, self.etcd, self.workdir = cp, ns, name, etcd, workdir
        self.shm = Path("/dev/shm") / f"tandem-kubelet-{uuid.uuid4().hex[:8]}"
        self.running: list[LocalContainer] = []

    def start(self, generation: int, pods: list[dict[str, Any]]) -> Path:
        document = next(v for v in pods[0]["spec"]["volumes"] if v["name"] == "job-spec")["configMap"]["name"]
        text = get_json(self.cp, "configmap", document, "-n", self.ns)["data"]["job.yaml"]
        secret = get_json(self.cp, "secret", f"{self.name}-token", "-n", self.ns)["data"]["token"]
        job = localize(parse_job(yaml.safe_load(text)))
        run_dir = self.workdir / f"gen{generation}"
        run_dir.mkdir(parents=True)
        started = processes_for(pods, job, run_dir, self.etcd, token=base64.b64decode(secret).decode(),
                                shm_root=self.shm / f"gen{generation}")
        self.running += started  # a pod kept from an earlier generation runs on beside them
        for c in started:
            c.start()
        return run_dir

    def kill_pod(self, pod: str) -> None:
        """One pod lost (a node gone): its processes killed, its shared memory (emptyDir) removed."""
        for c in self.running:
            if c.pod == pod:
                c.stop(grace=0.0)
        for shm in self.shm.glob(f"gen*/{pod}"):
            shutil.rmtree(shm, ignore_errors=True)

    def freeze(self) -> None:
        """SIGSTOP every container's process group: the run holds still where it is (until `kill`)."""
        for c in self.running:
            c.signal_group(signal.SIGSTOP)

    def kill(self) -> None:
        for c in self.running:
            c.stop(grace=0.0)
        shutil.rmtree(self.shm, ignore_errors=True)  # the pods' emptyDirs go with the pods

    def scrape(self, container: str) -> dict[str, float]:
        """name → value of the first sample of each metric on a running container's /metrics."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        port = next(c.env["TANDEM_CE_PORT"] for c in self.running if c.name == container)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:  # noqa: S310
            text = r.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, float(sample.value))
        return out

    def families(self, container: str) -> set[str]:
        """The metric families a running container's /metrics exposes (with or without samples)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        port = next(c.env["TANDEM_CE_PORT"] for c in self.running if c.name == container)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:  # noqa: S310
            return {f.name for f in text_string_to_metric_families(r.read().decode())}

    def tails(self) -> str:
        return "\n".join(f"--- {c.label} (exit {c.exit_code()})\n{c.tail(25)}" for c in self.running)


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    metrics = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


def test_gang_restart_resumes_from_the_durable_copy(
    k8s: ControlPlane, operator: OperatorProcess, ns: str, etcd_server: Any, toy: Path, tmp_path: Path
) -> None:
    name, volume = "resume", tmp_path / "volume"
    uid = create(k8s, ns, job_doc(name, ns, toy, volume))["metadata"]["uid"]
    kubelet = Kubelet(k8s, ns, name, etcd_server.endpoint, tmp_path / "kubelet")
    store = DurableStore(volume / "tandem", ns, name, uid, keep=2)  # the pods got the job's uid from the operator
    try:
        pods = wait_for("generation 0 pod", lambda: running(k8s, ns, name, 1), 60)
        env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
        assert env["TANDEM_RESUME"] == "1" and env["TANDEM_JOB_UID"] == uid
        gen0 = kubelet.start(0, pods)
        monitored = families()  # built before the wait: the scrapes below stay close to the freeze
        wait_for("two durable copies", lambda: len(store.versions()) == 2 or None, 600, every=0.1)
        # the driver's /metrics, live: its loop has recorded the two iterations it copied (a copy
        # starts in the iteration's persist phase, the row is recorded after its sync)
        scraped = wait_for("two iterations on /metrics",
                           lambda: (m := kubelet.scrape("trainer"))["tandem_trainer_iteration"] >= 2 and m, 60,
                           every=0.1)
        # the live endpoints serve every family the dashboard's check reads off the registries (test_monitoring)
        live = {port: kubelet.families(container) for container, port in (("trainer", "ce-trainer"),
                                                                           ("rollout", "ce-rollout"))}
        kubelet.freeze()  # what gen 0 did is now fixed: its rows and durable copies no longer move
        assert scraped["tandem_trainer_iteration"] >= 2 and scraped["tandem_engine_version"] >= 2
        assert scraped["tandem_trainer_phase_seconds_count"] >= 2
        for port, served in live.items():
            assert len(monitored[port]) >= 3 and not monitored[port] - served, (port, sorted(monitored[port] - served))
        before = rows_of(gen0)
        saved = store.latest()
        assert saved is not None and 2 <= saved.iteration < ITERATIONS, saved  # stopped mid-run

        kubelet.kill()  # the trainer dies with its pod: processes and shared memory gone
        fail_pod(k8s, ns, f"{name}-0")
        wait_for("gang restart", lambda: phase_is(k8s, ns, name, "Restarting", restarts=1)
                 or phase_is(k8s, ns, name, "Pending", restarts=1), 60)
        pods = wait_for("generation 1 pod", lambda: running(k8s, ns, name, 1, generation=1), 60)
        assert store.latest() == saved  # a frozen, then killed, gen 0 left no newer copy behind
        gen1 = kubelet.start(1, pods)
        wait_for("Succeeded", lambda: phase_is(k8s, ns, name, "Succeeded", restarts=1), 900, every=1.0)
    except BaseException:
        print(kubelet.tails())
        raise
    finally:
        kubelet.kill()

    after = rows_of(gen1)
    assert [r["iteration"] for r in after] == list(range(saved.iteration, ITERATIONS)), (before, after)
    assert len(before) >= saved.iteration - 1  # generation 0 really did those iterations
    # the restarted driver loaded the durable version, re-published it as the next version, and the
    # rollouts generated the first resumed iteration with it
    log = (gen1 / "logs" / f"{name}-0-trainer.log").read_text()
    assert f"resuming from version {saved.version} ({saved.path}) at iteration {saved.iteration}" in log
    assert f"restored training state of version {saved.version} (optimizer) from" in log  # Adam's moments too
    assert after[0]["rollout_version"] == saved.version + 1
    st = get_json(k8s, "rlhfjob", name, "-n", ns)["status"]
    assert st["iteration"] == ITERATIONS and st["restarts"] == 1


def test_gang_restart_without_persist_resumes_from_the_kept_rollout_only_pod(
    k8s: ControlPlane, operator: OperatorProcess, ns: str, etcd_server: Any, toy: Path, tmp_path: Path
) -> None:
    """No checkpointEngine.persist: the hybrid pod (the trainer) is lost mid-run; the operator restarts the gang but
    keeps the running rollout-only pod, which still holds the newest version it pulled. The restarted driver
    resumes from that version, at the iteration after the one that published it, not from the initial model."""
    name = "kept"
    doc = job_doc(name, ns, toy, tmp_path / "unused")
    doc["spec"].pop("volumes")
    doc["spec"]["checkpointEngine"].pop("persist")
    doc["spec"]["rolloutOnlyReplicas"] = 1
    create(k8s, ns, doc)
    kubelet = Kubelet(k8s, ns, name, etcd_server.endpoint, tmp_path / "kubelet")
    try:
        pods = wait_for("generation 0 pods", lambda: running(k8s, ns, name, 2), 60)
        uid_kept = next(p["metadata"]["uid"] for p in pods if p["metadata"]["name"] == f"{name}-1")
        gen0 = kubelet.start(0, pods)
        wait_for("three iterations", lambda: len(rows_of(gen0)) >= 3 or None, 600, every=0.1)
        kubelet.kill_pod(f"{name}-0")  # the trainer's pod is lost, shared memory and all
        held = layout.list_versions(kubelet.shm / "gen0" / f"{name}-1", name)
        assert held, "the rollout-only pod holds no version"
        before = rows_of(gen0)
        fail_pod(k8s, ns, f"{name}-0")
        pods = wait_for("generation 1: a new hybrid pod, the rollout-only pod kept",
                        lambda: running(k8s, ns, name, 2, generation=1), 120)
        kept = next(p for p in pods if p["metadata"]["name"] == f"{name}-1")
        assert kept["metadata"]["uid"] == uid_kept  # relabelled into generation 1, not recreated
        gen1 = kubelet.start(1, [p for p in pods if p["metadata"]["name"] == f"{name}-0"])
        wait_for("Succeeded", lambda: phase_is(k8s, ns, name, "Succeeded", restarts=1), 900, every=1.0)
    except BaseException:
        print(kubelet.tails())
        raise
    finally:
        kubelet.kill()

    log = (gen1 / "logs" / f"{name}-0-trainer.log").read_text()
    resumed = [line for line in log.splitlines() if "held by the kept rollout-only pods" in line]
    assert resumed, log[-3000:]
    version = int(resumed[0].split("version ", 1)[1].split(",", 1)[0])
    assert version >= held[-1] and version > 0, (version, held)  # what the kept pod held, never the initial model
    after = rows_of(gen1)
    first = after[0]["iteration"]
    assert f"resuming from version {version} " in log and f"at iteration {first}" in log
    assert first >= 2 and first >= len(before) - 1, (before, after)  # what was learnt is kept: not iteration 0
    assert [r["iteration"] for r in after] == list(range(first, ITERATIONS))
    assert after[0]["rollout_version"] == version + 1  # re-published as the next version, generated with
    st = get_json(k8s, "rlhfjob", name, "-n", ns)["status"]
    assert st["iteration"] == ITERATIONS and st["restarts"] == 1
    kept_log = (tmp_path / "kubelet" / "gen0" / "logs" / f"{name}-1-rollout.log").read_text()
    assert "serving it" in kept_log and "gang generation 1 started" in kept_log  # it followed the new gang
