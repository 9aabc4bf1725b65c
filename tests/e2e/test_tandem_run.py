"""End to end: `tandem run` on a tiny toy model with real etcd, vLLM (CPU) and megatron-core.

Runs the CLI as a user would (a subprocess), then checks what it left behind: the loop ran every
iteration with a hybrid pod and a rollout-only pod (which pulls each version over TCP); each
iteration published a new weight version that the rollouts then generated with (versions
advance, on-policy); the live vLLM's greedy output changed as the weights did; the metrics and
the plot were written; and nothing was left running or in shared memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.megatron, pytest.mark.etcd]

ITERATIONS = 4


def processes_of(runs: Path) -> list[int]:
    """Live processes started for this run (their TANDEM_OUTPUT_DIR lies under `runs`)."""
    mark = f"TANDEM_OUTPUT_DIR={runs.resolve()}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


USED: list[str] = []  # job names the current test ran; their /dev/shm dirs are removed after it


@pytest.fixture(autouse=True)
def remove_shm_dirs() -> Iterator[None]:
    """Each test's jobs' /dev/shm dirs go even when it fails (a `--keep-etcd` run keeps its own)."""
    import shutil

    yield
    while USED:
        shutil.rmtree(Path("/dev/shm") / f"tandem-default-{USED.pop()}", ignore_errors=True)


def demo_job(toy: Path, name: str) -> dict[str, Any]:
    """The toy job (examples/tiny-grpo.yaml, `make toy-demo`), renamed, on the test's toy model and prompts."""
    USED.append(name)
    job: dict[str, Any] = yaml.safe_load((Path(__file__).parents[2] / "examples" / "tiny-grpo.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["model"]["path"] = str(toy / "model")
    job["spec"]["dataset"]["path"] = str(toy / "train.jsonl")
    return job


def run_cmd(job: dict[str, Any], tmp_path: Path) -> list[str]:
    """Write the job file; the `tandem run` command line for it, with runs under tmp_path/runs."""
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(job))
    return [sys.executable, "-m", "tandem.cli.main", "run", str(spec_file), "--workdir", str(tmp_path / "runs")]


def run_ok(cmd: list[str]) -> str:
    """Run to the end; what it printed (stdout and stderr: pipes, not a terminal)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tandem.sidecars.toy.build import build_toy

    root = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "test-toy"
    return build_toy(root, seed=0, warmup_steps=40, max_operand=10).root


def test_tandem_run_learns_and_syncs(toy: Path, tmp_path: Path) -> None:
    job = demo_job(toy, "e2e-grpo")
    job["spec"]["algorithm"].update(iterations=ITERATIONS, lr=3e-3)
    job["spec"]["rollout"]["promptsPerIteration"] = 8
    job["spec"]["rolloutOnlyReplicas"] = 1  # a second pod that only generates: gets weights over TCP
    printed = run_ok(run_cmd(job, tmp_path))
    runs = tmp_path / "runs"
    # no terminal: one plain line per iteration (tandem.cli.progress_lines), not the live table
    progress = [line for line in printed.splitlines() if line.startswith("iteration ")]
    assert [line.split()[1] for line in progress] == [f"{i}/{ITERATIONS}" for i in range(1, ITERATIONS + 1)], printed
    assert all(" reward " in line and " s/it  ETA " in line for line in progress), progress

    rows = [json.loads(line) for line in (runs / "e2e-grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    published = [r["weight_version"] for r in rows]
    assert published == list(range(published[0], published[0] + ITERATIONS)), published
    # the rollout of iteration i generated with the version published by iteration i-1 (on-policy)
    assert [r["rollout_version"] for r in rows[1:]] == published[:-1]
    assert rows[0]["rollout_version"] == published[0] - 1
    probes = [r["probe"]["greedy"] for r in rows]
    assert len(set(probes)) > 1, f"greedy output never changed across versions: {probes}"
    # the rollout-only pod (its own shm dir) pulled every version from the trainer's pod
    pulled = (runs / "e2e-grpo" / "logs" / "e2e-grpo-1-rollout.log").read_text()
    for v in [published[0] - 1, *published[:-1]]:
        assert f"pulled version {v} " in pulled, f"rollout-only pod never pulled version {v}"
    for r in rows:
        assert r["rollouts"] == 2
        assert r["completions"] == 8 * job["spec"]["algorithm"]["groupSize"]
        assert 0.0 <= r["reward_mean"] <= 1.1
        assert set(r["seconds"]) >= {"rollout", "inference", "train", "publish", "sync", "onload", "offload"}
        assert r["kl"] is not None
    assert (runs / "e2e-grpo" / "progress.png").stat().st_size > 10_000
    assert not Path("/dev/shm/tandem-default-e2e-grpo").exists(), "shared memory left behind"
    assert not processes_of(runs), "processes left running"


def test_ctrl_c_stops_cleanly_and_resume_continues(toy: Path, tmp_path: Path) -> None:
    """Ctrl-C mid-run leaves no process behind; `--resume` continues from the last published version.

    The trainer runs at TP=2 (two gloo ranks in the pod): rank 0 drives, both export and resume.
    """
    import signal
    import time

    job = demo_job(toy, "e2e-resume")
    iterations = 40  # a toy iteration takes ~0.3 s now: 5 could all finish before the Ctrl-C lands
    # grpo's rloo preset (the KL to the reference as a reward penalty, from the trainer's own old log-probs)
    # runs here rather than in a run of its own: its checks need two iterations, like this test's
    job["spec"]["algorithm"]["iterations"] = iterations
    for key in ("klCoef", "clip"):
        job["spec"]["algorithm"].pop(key)
    job["spec"]["algorithm"]["preset"] = "rloo"
    job["spec"]["rollout"]["promptsPerIteration"] = 4
    job["spec"]["trainer"]["tensorParallel"] = 2  # two gloo trainer ranks: collective export, resume on both
    runs = tmp_path / "runs"
    metrics = runs / "e2e-resume" / "metrics.jsonl"
    cmd = run_cmd(job, tmp_path) + ["--keep-etcd"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.5)
    assert proc.poll() is None, f"run ended before Ctrl-C: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) != 0  # interrupted: not done
    assert not processes_of(runs), "sidecars left running after Ctrl-C"  # tandem run waited for them all
    first = [json.loads(line) for line in metrics.read_text().splitlines()]
    done_before = [r["iteration"] for r in first]
    assert done_before[:2] == [0, 1]
    assert first[0]["prepare_kl_reward"] == 0.0  # rloo: the first policy is the reference
    assert first[1]["prepare_kl_reward"] != 0.0 and not any("kl" in r for r in first), first  # in the rewards only
    generation = runs / "e2e-resume" / "generation"
    assert generation.read_text() == "0"

    # the resumed run goes on to 3 iterations past the interrupted one's last row (not to the spec's 40: the
    # behaviour is the same after a few, and each toy iteration costs seconds of the suite)
    target = done_before[-1] + 4
    run_ok(cmd[:-1] + ["--resume", "--iterations", str(target)])
    assert generation.read_text() == "1"  # the next gang generation: the first run's rollout records don't count
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    its = [r["iteration"] for r in rows]
    # Each iteration runs at most once: an iteration interrupted between publishing its weights and
    # writing its metrics row counts as done (its weights are the resumed ones), so it has no row.
    assert its == sorted(set(its)) and its[-1] == target - 1 and len(its) >= target - 1, its
    first_resumed = rows[len(done_before)]
    assert first_resumed["iteration"] - done_before[-1] in (1, 2), its
    versions = [r["weight_version"] for r in rows]
    assert versions == sorted(set(versions)), versions
    # the resumed rollout generated with the newest version the first run published
    assert first_resumed["rollout_version"] == first_resumed["weight_version"] - 1
    assert first_resumed["rollout_version"] >= rows[len(done_before) - 1]["weight_version"]


@pytest.mark.parametrize("algorithm", ["ppo-critic", "dpo", "grpo-gspo", "grpo-dapo"])
def test_other_algorithms_run_end_to_end(toy: Path, tmp_path: Path, algorithm: str) -> None:
    """PPO with a learned critic (old-policy log-probs from the trainer, ratio clipping over 2 epochs, a
    value-head Megatron engine trained on the returns), DPO (pairs from each prompt's best and worst
    completions), and two grpo presets: gspo (the sequence ratio, clipped at 4e-4) and dapo (dynamic
    sampling: groups whose rewards tie dropped and refilled) through the same loop. PPO without a critic
    runs in test_durable_checkpoint_outlives_shared_memory, the rloo preset in the Ctrl-C test."""
    job = demo_job(toy, f"e2e-{algorithm}")
    name, _, preset = algorithm.partition("-")
    job["spec"]["algorithm"].update(name=name, iterations=2, epochs=2, lr=1e-3, critic=preset == "critic")
    if name == "grpo":
        for key in ("klCoef", "clip"):  # the preset's (rloo keeps the defaults, gspo takes 0 and 3e-4)
            job["spec"]["algorithm"].pop(key, None)
        job["spec"]["algorithm"]["preset"] = preset
    job["spec"]["rollout"]["promptsPerIteration"] = 8
    run_ok(run_cmd(job, tmp_path))
    runs = tmp_path / "runs"
    rows = [json.loads(line) for line in (runs / f"e2e-{algorithm}" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    if algorithm.startswith("ppo"):
        # the second epoch sees a moved policy: ratios leave 1 only if old log-probs were supplied
        assert any(abs(r["ratio_mean"] - 1.0) > 1e-6 for r in rows), rows
    if algorithm == "ppo-critic":
        assert rows[0]["prepare_value_mean"] == 0.0  # a fresh value head
        assert all(r["value_loss"] > 0 and r["critic_grad_norm"] > 0 for r in rows), rows
        assert rows[1]["prepare_value_mean"] != 0.0  # the critic trained on iteration 0's returns
    elif algorithm == "grpo-dapo":  # dynamic sampling: only groups whose rewards differ are trained on
        group, prompts = job["spec"]["algorithm"]["groupSize"], job["spec"]["rollout"]["promptsPerIteration"]
        for r in rows:
            kept = r["dynamic_kept_groups"]
            assert 1 <= r["dynamic_rounds"] <= 3 and r["dynamic_full"] == (kept == prompts), r
            assert r["completions"] == group * (kept or prompts), r  # nothing informative: the first round
    elif algorithm == "grpo-gspo":  # the second epoch's sequence ratios leave the 4e-4 band
        assert any(r["clip_frac"] > 0 for r in rows) and any(abs(r["ratio_mean"] - 1.0) > 1e-6 for r in rows), rows
    else:
        assert all(r.get("pairs", 0) > 0 or r.get("skipped_train") for r in rows), rows


def test_durable_checkpoint_outlives_shared_memory(toy: Path, tmp_path: Path) -> None:
    """With checkpointEngine.persist, a run whose shared memory and etcd are gone (what a gang
    restart in a cluster leaves: new pods, empty /dev/shm) resumes from the durable copy.

    The volume is a hostPath (tandem run rewrites /ckpt/... to it, as a bind mount would). The job is PPO
    without a critic (old-policy log-probs from the trainer, ratio clipping over 2 epochs), which runs here
    rather than in a run of its own."""
    import torch

    from tandem.checkpoint_engine.versions import layout
    from tandem.checkpoint_engine.versions.durable import DurableStore

    job = demo_job(toy, "e2e-durable")
    job["spec"]["algorithm"].update(name="ppo", iterations=3, epochs=2, lr=3e-3)
    job["spec"]["rollout"]["promptsPerIteration"] = 4
    job["spec"]["volumes"] = [{"name": "ckpt", "mountPath": "/ckpt", "hostPath": str(tmp_path / "pvc")}]
    job["spec"]["checkpointEngine"]["persist"] = {"path": "/ckpt/tandem", "every": 2, "keep": 2}
    runs = tmp_path / "runs"
    cmd = run_cmd(job, tmp_path)
    run_ok(cmd)  # no --keep-etcd: etcd data and shared memory are removed at the end
    assert not Path("/dev/shm/tandem-default-e2e-durable").exists() and not (runs / "e2e-durable" / "etcd").exists()
    uid = (runs / "e2e-durable" / "job-uid").read_text().strip()
    store = DurableStore(tmp_path / "pvc" / "tandem", "default", "e2e-durable", uid, keep=2)
    rows = [json.loads(line) for line in (runs / "e2e-durable" / "metrics.jsonl").read_text().splitlines()]
    # PPO: the second epoch sees a moved policy (ratios leave 1 only if old log-probs were supplied); no critic
    assert any(abs(r["ratio_mean"] - 1.0) > 1e-6 for r in rows) and not any("value_loss" in r for r in rows), rows
    # copies after 2 iterations (every: 2) and after the last one, of the versions those iterations published
    assert [store.read(v).iteration for v in store.versions()] == [2, 3]
    assert store.versions() == [rows[1]["weight_version"], rows[2]["weight_version"]]
    assert store.train_versions() == store.versions()  # the optimizer state of each copy, beside it
    assert rows[1]["train_state_bytes"] > 0 and "train_state_bytes" not in rows[0]
    newest = store.latest()
    assert newest is not None
    trained = dict(layout.MappedVersion(newest.path).tensors())
    from safetensors.torch import load_file

    initial = load_file(str(next((toy / "model").glob("*.safetensors"))))
    assert any(not torch.equal(trained[k], initial[k].to(trained[k].dtype)) for k in initial if k in trained)

    run_ok(cmd + ["--resume", "--iterations", "5"])
    rows = [json.loads(line) for line in (runs / "e2e-durable" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3, 4]  # continued after the durable copy's iteration
    # the resumed trainer re-published the durable weights as the next version and generated with it
    assert rows[3]["rollout_version"] == newest.version + 1
    log = (runs / "e2e-durable" / "logs" / "e2e-durable-0-trainer.log").read_text()
    assert f"resuming from version {newest.version} ({newest.path}) at iteration 3" in log
    assert f"restored training state of version {newest.version} (optimizer) from" in log
    assert [store.read(v).iteration for v in store.versions()] == [4, 5]
