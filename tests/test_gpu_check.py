"""`make gpu-check` (scripts/gpu-check.sh) cannot run without a GPU; here: the script parses, the Makefile
runs it, and the GPU tests it runs are collected under the `gpu` marker and skipped naming CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_script_parses_and_make_runs_it() -> None:
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu-check.sh")], check=True)
    dry = subprocess.run(["make", "--no-print-directory", "-n", "gpu-check"], cwd=ROOT, capture_output=True,
                         text=True, check=True)  # (under `make test` a sub-make would name its directory)
    assert dry.stdout.strip() == "scripts/gpu-check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine: make gpu-check runs the GPU tests for real")
def test_gpu_tests_are_collected_and_skipped_naming_cuda() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rs", "-p",
                           "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    # Megatron and hf in bf16, vLLM on CUDA, MoE routing replay
    assert "4 skipped" in done.stdout, done.stdout[-3000:]
    assert "needs a CUDA GPU: torch.cuda.is_available() is False" in done.stdout, done.stdout[-3000:]
