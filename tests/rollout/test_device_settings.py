"""The job's device fields → the trainer's dtype and vLLM's arguments (`tandem.spec.devices`), and the
rollout entry's EngineConfig built from them: one table, GPU and CPU, defaults and explicit values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tandem.sidecars.rollout.__main__ import engine_config
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.spec import devices
from tandem.spec.models import JobSpec
from tandem.spec.podenv import PodEnv


def spec(gpus: int, trainer: dict[str, Any] | None = None, rollout: dict[str, Any] | None = None) -> JobSpec:
    return JobSpec.model_validate({"model": {"path": "m"}, "dataset": {"path": "d.jsonl"}, "gpusPerPod": gpus,
                                   "rewards": [{"type": "answerMatch"}], "trainer": trainer or {},
                                   "rollout": rollout or {}})


CASES = [  # gpus, trainer, rollout -> dtype, gpu memory share, eager, sleep mode, sleep level
    (8, {}, {}, ("bfloat16", 0.85, False, False, 2)),
    (0, {}, {}, ("float32", 0.85, True, False, 2)),
    (8, {"dtype": "float16"}, {"gpuMemoryUtilization": 0.6, "cudaGraphs": False}, ("float16", 0.6, True, False, 2)),
    (0, {"dtype": "bfloat16"}, {"cudaGraphs": True}, ("bfloat16", 0.85, True, False, 2)),  # CPU: always eager
    (2, {"dtype": "float32"}, {"betweenRollouts": "sleep", "sleepLevel": 1}, ("float32", 0.85, False, True, 1)),
    (2, {}, {"betweenRollouts": "sleep", "sleepLevel": "auto"}, ("bfloat16", 0.85, False, True, 2)),
    (2, {}, {"betweenRollouts": "sleep", "sleepLevel": 2, "gpuMemoryUtilization": 1},
     ("bfloat16", 1.0, False, True, 2)),
]


@pytest.mark.parametrize(("gpus", "trainer", "rollout", "want"), CASES)
def test_spec_to_vllm_settings(gpus: int, trainer: dict[str, Any], rollout: dict[str, Any],
                               want: tuple[str, float, bool, bool, int], tmp_path: Path) -> None:
    s = spec(gpus, trainer, rollout)
    got = devices.vllm_settings(s)
    assert (got.dtype, got.gpu_memory_utilization, got.enforce_eager, got.enable_sleep_mode, got.sleep_level) == want
    assert devices.trainer_dtype(s) == got.dtype  # one dtype for the trainer, its publish and vLLM

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"max_position_embeddings": 2048}')
    s = s.model_copy(update={"model": s.model.model_copy(update={"path": str(tmp_path / "m")})})
    env = PodEnv.model_validate(PodEnv.environ(job="j", role="rollout", pod="j-0", job_file=tmp_path / "job.yaml",
                                               etcd_endpoints="127.0.0.1:2379", port=8700, shm_dir=tmp_path))
    cfg = engine_config(env, s)
    assert (cfg.dtype, cfg.gpu_memory_utilization, cfg.enforce_eager, cfg.enable_sleep_mode) == want[:4]
    assert cfg.max_model_len == min(2048, s.rollout.max_tokens + 1024)


@pytest.mark.parametrize("bad", [{"sleepLevel": 3}, {"sleepLevel": "2"}, {"gpuMemoryUtilization": 0},
                                 {"gpuMemoryUtilization": 1.5}])
def test_bad_rollout_fields_name_the_field(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        spec(1, rollout=bad)


def test_engine_on_cpu_is_eager_whatever_the_config_says(tmp_path: Path) -> None:
    engine = RolloutEngine(EngineConfig(shm_root=tmp_path, job="j", enforce_eager=False))
    assert engine._enforce_eager() is (True if not engine._on_gpu() else False)
