"""`tandem run` and the rollout's core policy: where pods share the machine's cores (several pods,
not pinned) every sidecar gets vLLM's default reservation explicitly, so no vLLM takes every core."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tandem.cli import local
from tandem.sidecars.rollout_engine.engine import CPU_RESERVED_ENV
from tandem.spec.load import parse_spec


def job(rollout_only: int) -> Any:
    return parse_spec({"model": {"path": "/m"}, "dataset": {"path": "/d.jsonl"}, "gpusPerPod": 0,
                       "rewards": [{"type": "answerMatch"}], "rolloutOnlyReplicas": rollout_only}, name="cores")


@pytest.mark.parametrize(("rollout_only", "pin", "want"), [(1, False, "1"), (1, True, None), (0, False, None)])
def test_shared_cores_keep_vllms_reservation(rollout_only: int, pin: bool, want: str | None, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CPU_RESERVED_ENV, raising=False)
    etcd = SimpleNamespace(endpoint="http://127.0.0.1:2379")
    containers = local._prepare(job(rollout_only), tmp_path, etcd, resume=False, pin_pods=pin)  # type: ignore[arg-type]
    assert len({c.pod for c in containers}) == 1 + rollout_only
    assert {c.env.get(CPU_RESERVED_ENV) for c in containers} == {want}


def test_an_explicit_setting_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CPU_RESERVED_ENV, "0")
    etcd = SimpleNamespace(endpoint="http://127.0.0.1:2379")
    containers = local._prepare(job(1), tmp_path, etcd, resume=False, pin_pods=False)  # type: ignore[arg-type]
    assert {c.env[CPU_RESERVED_ENV] for c in containers} == {"0"}
