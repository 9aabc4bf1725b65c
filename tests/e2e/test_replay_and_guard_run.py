"""End to end through `tandem run`: a MoE job with routing replay, several optimizer steps an iteration and the
drift guard armed, which stays quiet on the healthy run; and the drift guard firing on a drift injected in the
sampler (nucleus sampling at topP 0.3, a truncated distribution the trainer does not model, so every sampled
token's rollout log-prob sits above the trainer's) and failing the job with its line.

The healthy run is the toy MoE (a mixtral of 4 experts, top-2: `tandem.sidecars.toy --family mixtral`) on the
Megatron engine: every sample carries the rollout's routing and the trainer replays it (`routed_frac`), the two
optimizer steps of an iteration take their ratio against the sampling policy (step 1 at 1 exactly, step 2 off
it), and the rollout/trainer KL stays far under the guard's threshold. The drifted run is the demo's dense toy.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

# remove_shm_dirs (autouse: each test's /dev/shm dirs go) is a fixture
from test_tandem_run import demo_job, processes_of, remove_shm_dirs, run_cmd, run_ok, toy  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.etcd, pytest.mark.megatron]

THRESHOLD = 0.01  # mismatch_kl per token: healthy fp32 engines measure ~1e-6, the topP 0.3 drift ~0.1 and more
GUARD = {"metric": "kl", "threshold": THRESHOLD, "iterations": 2, "action": "fail"}


@pytest.fixture(scope="module")
def moe_toy() -> Path:
    from tandem.sidecars.toy.build import build_toy

    root = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "test-toy-moe"
    return build_toy(root, seed=0, warmup_steps=40, max_operand=10, family="mixtral").root


def test_moe_replay_with_two_steps_and_a_quiet_guard(moe_toy: Path, tmp_path: Path) -> None:
    job = demo_job(moe_toy, "e2e-moe-replay")
    iterations = 3
    job["spec"]["algorithm"].update(iterations=iterations, lr=2e-3, routingReplay="on", mismatchGuard=GUARD)
    job["spec"]["rollout"]["promptsPerIteration"] = 8
    job["spec"]["trainer"].update(engine="megatron", globalBatchSize=32, microBatchSize=8)  # 64 samples: 2 steps
    run_ok(run_cmd(job, tmp_path))
    runs = tmp_path / "runs" / "e2e-moe-replay"
    rows = [json.loads(line) for line in (runs / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(iterations))
    for r in rows:
        assert r["engine"] == "megatron" and r["routed_frac"] == 1.0, r  # every sample's routing replayed
        assert r["optimizer_steps"] == 2.0 and len(r["steps"]) == 2
        first, second = r["steps"]
        assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # against the policy that sampled
        assert abs(second["ratio_mean"] - 1.0) > 1e-6  # the second step's ratio is not 1 by construction
        assert r["mismatch_kl"] < THRESHOLD / 100, r["mismatch_kl"]
        assert r.get("mismatch_guard", {}).get("action", "ok") == "ok", r.get("mismatch_guard")
    assert not processes_of(tmp_path / "runs"), "processes left running"


def test_drift_in_the_sampler_trips_the_guard(toy: Path, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    job = demo_job(toy, "e2e-guard-drift")
    job["spec"]["algorithm"].update(iterations=6, mismatchGuard=GUARD)
    job["spec"]["rollout"].update(promptsPerIteration=8, topP=0.3)
    proc = subprocess.run(run_cmd(job, tmp_path), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "MismatchGuardTripped" in out and "algorithm.mismatchGuard: mismatch_kl" in out, out[-3000:]
    rows = [json.loads(line) for line in
            (tmp_path / "runs" / "e2e-guard-drift" / "metrics.jsonl").read_text().splitlines()]
    # two iterations over the threshold: the first warns of its streak, the second's row records the failure
    # (its update unpublished) and the job ends there, four iterations early
    assert [r["iteration"] for r in rows] == [0, 1], rows
    assert all(r["mismatch_kl"] > THRESHOLD for r in rows), [r["mismatch_kl"] for r in rows]
    assert [r["mismatch_guard"]["streak"] for r in rows] == [1, 2]
    assert rows[-1]["mismatch_guard"]["action"] == "fail"
    assert not processes_of(tmp_path / "runs"), "processes left running"
