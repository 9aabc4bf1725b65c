"""The trainer's entry point on a failure: one line naming pod, component and cause. A failure the job's own
bounds decide (no healthy rollout within failurePolicy.rolloutUnavailableSeconds: `RolloutError`, raised in the
process or, with several ranks, by mp.spawn as the text of a rank's traceback) is that line alone, no traceback;
an unforeseen one logs its traceback first. In process, the rank's loop replaced by one that raises."""

from __future__ import annotations

import logging
import traceback
from types import SimpleNamespace
from typing import Any

import pytest

from tandem.sidecars.trainer import __main__ as entry
from tandem.sidecars.trainer.loop.rollout.rollout_health import RolloutError, RolloutHung

NONE_CAME_BACK = ("no healthy rollout: http://10.0.0.7:8000: gone; none came back within 600s "
                  "(failurePolicy.rolloutUnavailableSeconds)")


def spawned(e: Exception) -> Exception:
    """The exception mp.spawn raises for a rank that raised `e`: the rank's traceback as text."""
    try:
        raise e
    except Exception:  # noqa: BLE001 - formatted as torch.multiprocessing's child does
        text = traceback.format_exc()
    return RuntimeError(f"\n\n-- Process 1 terminated with the following error:\n{text}")


def fail_with(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception) -> list[Any]:
    env = SimpleNamespace(pod="j-0", gpu_ids_file=None)
    job = SimpleNamespace(spec=SimpleNamespace(gpus_per_pod=0, trainer_ranks_per_pod=lambda: 1))
    monkeypatch.setattr(entry, "start_sidecar", lambda log: (env, job))
    monkeypatch.setattr(entry.preflight, "check", lambda spec: None)

    def run_rank(*_: Any) -> None:
        raise error

    monkeypatch.setattr(entry, "run_rank", run_rank)
    with caplog.at_level(logging.INFO, logger="tandem.trainer"):
        assert entry.main() == 1
    return [r for r in caplog.records if r.name == "tandem.trainer"]


@pytest.mark.parametrize("error", [RolloutError(NONE_CAME_BACK), spawned(RolloutError(NONE_CAME_BACK))],
                         ids=["in-process", "a-spawned-rank"])
def test_no_rollout_within_the_bound_is_one_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception) -> None:
    records = fail_with(monkeypatch, caplog, error)
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in records] == [
        ("ERROR", f"pod j-0, trainer: RolloutError: {NONE_CAME_BACK}", None)]
    assert "Traceback" not in caplog.text


def test_a_subclass_raised_in_a_rank_is_bounded_too() -> None:
    assert entry.bounded(spawned(RolloutHung("http://a:1: /v1/generate made no progress for 5s")))
    assert entry.one_line(spawned(RolloutHung("x"))) == "RolloutHung: x"


@pytest.mark.parametrize("error", [ValueError("bad shape (3, 4)"), spawned(ValueError("bad shape (3, 4)"))],
                         ids=["in-process", "a-spawned-rank"])
def test_an_unforeseen_failure_logs_its_traceback_then_the_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception) -> None:
    records = fail_with(monkeypatch, caplog, error)
    assert records[0].exc_info is not None and records[0].getMessage() == "trainer failed"
    assert (records[-1].levelname, records[-1].getMessage()) == ("ERROR", "pod j-0, trainer: ValueError: bad shape "
                                                                          "(3, 4)")
    assert not entry.bounded(error)
