"""What a job's engine and device fields resolve to, in one place: the trainer's engine and dtype, vLLM's knobs.

Role: `trainer.engine` resolves to megatron or hf (`trainer_engine`). `gpusPerPod` decides GPU or CPU (the
sidecars refuse a GPU job without CUDA, `tandem.sidecars.gpu`), and from it and the spec come
`trainer.dtype` (auto: bfloat16 on GPU, float32 on CPU), used by the trainer's engine and as vLLM's dtype
so that the published weights pass the rollout's check (which demands the exact dtype: no conversion is
allowed there, so the trainer publishes in this one), and `rollout.gpuMemoryUtilization`, `sleepLevel`
and `cudaGraphs`. Both sidecars read the job file named by the pod env contract (TANDEM_JOB_FILE) and
call these functions, so they always agree.
Callers: the trainer's loop (`tandem.sidecars.trainer.loop`: start, switch, publish, report)
and the rollout's entry point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tandem.spec.models import REPLAY_FAMILIES, JobSpec, ModelRef, model_type

Dtype = Literal["float32", "bfloat16", "float16"]
DEFAULT_GPU_MEMORY_UTILIZATION = 0.85


def on_gpu(spec: JobSpec) -> bool:
    return spec.gpus_per_pod > 0


def trainer_dtype(spec: JobSpec) -> Dtype:
    """trainer.dtype with auto resolved: bfloat16 on GPUs, float32 on CPU."""
    if spec.trainer.dtype != "auto":
        return spec.trainer.dtype
    return "bfloat16" if on_gpu(spec) else "float32"


def trainer_engine(spec: JobSpec) -> Literal["megatron", "hf"]:
    """trainer.engine with auto resolved: hf with trainer.lora; else megatron where model.family or config.json's
    model_type has a weight mapping (or the file cannot be read), hf otherwise."""
    if spec.trainer.engine != "auto":
        return spec.trainer.engine
    if spec.trainer.lora is not None:
        return "hf"
    if spec.model.family != "auto":
        return "megatron"
    found = model_type(spec.model.path)
    return "hf" if found is not None and found not in ModelRef.FAMILIES else "megatron"


def routing_replay(spec: JobSpec) -> bool:
    """algorithm.routingReplay with auto resolved: on for grpo/ppo with single-turn rollouts on the megatron
    engine when model.family or config.json's model_type is a family both engines replay (the spec's rules
    have refused `on` where it cannot run); off for a dense model, an unreadable config with family auto, or
    anything else."""
    mode = spec.algorithm.routing_replay
    if mode != "auto":
        return mode == "on"
    if spec.algorithm.name not in ("grpo", "ppo") or trainer_engine(spec) != "megatron":
        return False
    if spec.rollout.environment is not None and spec.rollout.environment.type != "single":
        return False
    family = spec.model.family if spec.model.family != "auto" else model_type(spec.model.path)
    return family in REPLAY_FAMILIES


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
    memory; in RL every wake-up is followed by loading the new version (`trainer.loop.phases.publish.sync`), so the
    copy level 1 keeps would be thrown away: auto is 2; with adapter sync 1, whose versions apply to the
    base weights vLLM keeps."""
    level = spec.rollout.sleep_level
    if level == "auto":
        return 1 if adapter_sync(spec) else 2
    return level


def adapter_sync(spec: JobSpec) -> bool:
    """Whether versions carry LoRA adapters alone (trainer.lora.sync adapter), which vLLM serves as a LoRA
    adapter over the base model it loads from model.path."""
    return spec.trainer.lora is not None and spec.trainer.lora.sync == "adapter"


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
