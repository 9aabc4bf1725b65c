"""The rollout's CPU core policy: every core for vLLM unless it generates while its trainer trains."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tandem.sidecars.rollout.cores import reserved_cores
from tandem.sidecars.rollout_engine.engine import CPU_RESERVED_ENV, EngineConfig, prepare_env
from tandem.spec.load import parse_spec

BASE: dict[str, Any] = {"model": {"path": "/m"}, "dataset": {"path": "/d.jsonl"}, "gpusPerPod": 0,
                        "rewards": [{"type": "answerMatch"}]}


def spec(algorithm: dict[str, Any] | None = None, rollout: dict[str, Any] | None = None) -> Any:
    return parse_spec({**BASE, "algorithm": {"name": "grpo", **(algorithm or {})}, "rollout": rollout or {}}).spec


ASYNC = {"maxStaleness": 1, "tisCap": 2.0}


@pytest.mark.parametrize(("algorithm", "rollout", "rollout_only", "cores", "want"), [
    ({}, {}, False, 2, 0),  # synchronous: the trainer waits while vLLM generates
    ({}, {"betweenRollouts": "keep"}, False, 16, 0),
    ({"tisCap": 2.0}, {"partial": {"tokenBudget": 16}, "maxTokens": 64}, False, 2, 0),  # partial: still in turns
    (ASYNC, {"betweenRollouts": "keep"}, False, 2, None),  # async on the hybrid pod: generates while training
    (ASYNC, {"betweenRollouts": "keep"}, True, 2, 0),  # a rollout-only pod has its cores to itself
    (ASYNC, {"betweenRollouts": "sleep"}, False, 2, 0),  # the hybrid rollout only evaluates between steps
    ({}, {}, False, 1, None),  # one core: vLLM's default
])
def test_reserved_cores(algorithm: dict[str, Any], rollout: dict[str, Any], rollout_only: bool, cores: int,
                        want: int | None) -> None:
    assert reserved_cores(spec(algorithm, rollout), rollout_only=rollout_only, cores=cores) == want


def test_prepare_env_sets_the_reservation_unless_the_pod_env_does(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.delenv(CPU_RESERVED_ENV, raising=False)
    prepare_env(EngineConfig(shm_root=tmp_path, job="j"))
    assert CPU_RESERVED_ENV not in os.environ  # None: vLLM's default
    prepare_env(EngineConfig(shm_root=tmp_path, job="j", cpu_reserved_cores=0))
    assert os.environ[CPU_RESERVED_ENV] == "0"
    monkeypatch.setenv(CPU_RESERVED_ENV, "1")  # the user's podTemplate env
    prepare_env(EngineConfig(shm_root=tmp_path, job="j", cpu_reserved_cores=0))
    assert os.environ[CPU_RESERVED_ENV] == "1"
