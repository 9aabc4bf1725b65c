"""What a job's device fields resolve to, in one place: the trainer's dtype and the rollout's vLLM knobs.

Role: `gpusPerPod` decides GPU or CPU (the sidecars refuse a GPU job without CUDA, `tandem.sidecars.gpu`),
and from it and the spec come `trainer.dtype` (auto: bfloat16 on GPU, float32 on CPU), used by the
trainer's Megatron engine and as vLLM's dtype so that the published weights pass the rollout's check
(which demands the exact dtype: no conversion is allowed there, so the trainer publishes in this one),
and `rollout.gpuMemoryUtilization`, `sleepLevel` and `cudaGraphs`. Both sidecars read the job file
named by the pod env contract (TANDEM_JOB_FILE) and call these functions, so they always agree.
Callers: the trainer's context (`tandem.sidecars.trainer.context`) and the rollout's entry point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tandem.spec.models import JobSpec

Dtype = Literal["float32", "bfloat16", "float16"]
DEFAULT_GPU_MEMORY_UTILIZATION = 0.85


def on_gpu(spec: JobSpec) -> bool:
    return spec.gpus_per_pod > 0


def trainer_dtype(spec: JobSpec) -> Dtype:
    """trainer.dtype with auto resolved: bfloat16 on GPUs, float32 on CPU."""
    if spec.trainer.dtype != "auto":
        return spec.trainer.dtype
    return "bfloat16" if on_gpu(spec) else "float32"


@dataclass(frozen=True)
class VllmSettings:
    """The arguments of vLLM's `LLM` (and of its sleep) that the spec decides."""

    dtype: Dtype
    gpu_memory_utilization: float
    enforce_eager: bool
    enable_sleep_mode: bool
    sleep_level: int


def sleep_level(spec: JobSpec) -> int:
    """rollout.sleepLevel with auto resolved. Level 2 drops the weights instead of copying them to host
    memory; in RL every wake-up is followed by loading the new version (`TrainerContext.sync`), so the
    copy level 1 keeps would be thrown away: auto is 2."""
    level = spec.rollout.sleep_level
    return 2 if level == "auto" else level


def vllm_settings(spec: JobSpec) -> VllmSettings:
    gpu = on_gpu(spec)
    utilization = spec.rollout.gpu_memory_utilization
    return VllmSettings(
        dtype=trainer_dtype(spec),
        gpu_memory_utilization=DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization,
        enforce_eager=not (gpu and spec.rollout.cuda_graphs),  # vLLM-CPU has no CUDA graphs to capture
        enable_sleep_mode=spec.rollout.between_rollouts == "sleep",
        sleep_level=sleep_level(spec),
    )
