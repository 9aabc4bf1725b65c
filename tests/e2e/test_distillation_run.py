"""End to end: on-policy distillation through `tandem run` (real etcd, vLLM on CPU, megatron-core).

The student is the shared toy (~10% of its sums right); the teacher is the same architecture warmed up
further (~35%). With `taskReward: false` the only signal is the teacher's log-probs on the student's
own samples, scored in the Inference phase by swapping the teacher's weights into the trainer's engine,
as the reference model is. The reverse KL from student to teacher, measured on each iteration's fresh
samples, must fall as the student learns from them, and every version must reach the rollouts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import mean

import pytest

# toy and remove_shm_dirs (autouse: each test's /dev/shm dirs go) are fixtures
from test_tandem_run import demo_job, remove_shm_dirs, run_cmd, run_ok, toy  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.megatron, pytest.mark.etcd]

ITERATIONS = 8


@pytest.fixture(scope="module")
def teacher() -> Path:
    from tandem.sidecars.toy.build import build_toy

    root = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "test-toy-150"
    return build_toy(root, seed=0, warmup_steps=150, max_operand=10).root / "model"


def test_the_student_moves_towards_the_teacher(toy: Path, teacher: Path, tmp_path: Path) -> None:  # noqa: F811
    job = demo_job(toy, "e2e-distill")
    job["spec"]["algorithm"].update(iterations=ITERATIONS, lr=3e-4, klCoef=0.0, distillation={
        "teacher": str(teacher), "coef": 1.0, "taskReward": False})
    job["spec"]["rollout"]["promptsPerIteration"] = 16
    train = tmp_path / "train.jsonl"  # the same 16 prompts every iteration: the KL moves with the weights only
    train.write_text("".join((toy / "train.jsonl").read_text().splitlines(keepends=True)[:16]))
    job["spec"]["dataset"]["path"] = str(train)
    run_ok(run_cmd(job, tmp_path))
    rows = [json.loads(x) for x in (tmp_path / "runs" / "e2e-distill" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    kl = [r["prepare_distill_reverse_kl"] for r in rows]
    assert kl[0] > 0.05, kl  # the two models differ where the student samples
    assert mean(kl[-3:]) < 0.7 * mean(kl[:2]), kl
    versions = [r["weight_version"] for r in rows]  # one new version per iteration, each sampled from next
    assert versions == list(range(versions[0], versions[0] + ITERATIONS))
    assert [r["rollout_version"] for r in rows[1:]] == versions[:-1]
    print("reverse KL per iteration:", [round(x, 3) for x in kl])
