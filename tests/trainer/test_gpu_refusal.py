"""A job that asks for GPUs never runs on the CPU: each sidecar's real entry point, started with a pod
env whose job says gpusPerPod 1 on a machine without CUDA, exits non-zero naming why (CUDA not
available, the driver it found or not, CUDA_VISIBLE_DEVICES, torch's CUDA build) before touching etcd,
Megatron or vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tandem.spec.podenv import PodEnv

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: nothing to refuse")

JOB = """apiVersion: tandem.dev/v1alpha1
kind: RLHFJob
metadata: {name: wants-gpus}
spec:
  model: {path: model}
  dataset: {path: train.jsonl}
  gpusPerPod: 1
  rewards: [{type: answerMatch}]
"""


@pytest.mark.parametrize("role", ["trainer", "rollout"])
def test_entry_point_refuses_cpu_when_the_spec_asks_for_gpus(role: str, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    env |= PodEnv.environ(job="wants-gpus", role=role, pod="wants-gpus-0", job_file=job,
                          etcd_endpoints="127.0.0.1:1", port=1, shm_dir=tmp_path / "shm")
    env["CUDA_VISIBLE_DEVICES"] = "0"
    done = subprocess.run([sys.executable, "-m", f"tandem.sidecars.{role}"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 3, (done.returncode, done.stderr[-3000:])
    err = done.stderr
    for said in ("spec.gpusPerPod is 1", f"the {role} has no usable CUDA device", "will not fall back to the CPU",
                 "torch.cuda.is_available() is False", "CUDA_VISIBLE_DEVICES='0'", f"torch {torch.__version__}",
                 "NVIDIA_VISIBLE_DEVICES unset", "driver >= 580"):
        assert said in err, f"{said!r} missing from: {err[-2000:]}"
    assert ("NVIDIA driver " in err) or ("no NVIDIA driver found" in err), err[-2000:]
    assert not (tmp_path / "shm").exists(), "it started work before refusing"
