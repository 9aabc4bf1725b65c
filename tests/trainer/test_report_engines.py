"""The rollouts' engine counts the driver reports (`report.engines_after`, then the progress record's
rolloutEngines, which the operator copies into the job's status): engine restarts as the rollouts report their
total, rejoins added up over iterations, the latest iteration's recovery kept until another completes; the
asynchronous producer's counts (`producer_` keys) folded in; nothing reported by a source without rollouts."""

from __future__ import annotations

import json
from typing import Any

from tandem.sidecars.trainer.loop.phases.report import engines_after
from tandem.spec.progress import Progress, RolloutEngines


def fold(before: RolloutEngines | None, info: dict[str, Any]) -> RolloutEngines:
    out = engines_after(before, info)
    assert out is not None
    return out


def test_counts_fold_over_iterations() -> None:
    quiet = {"rollouts_dropped": 0, "rollouts_rejoined": 0, "rollout_restarts": 0}
    first = fold(None, quiet)
    assert first == RolloutEngines(restarts=0, rejoins=0, last_recovery_seconds=None)
    hung = fold(first, {**quiet, "rollouts_dropped": 1, "rollout_restarts": 1})
    back = fold(hung, {**quiet, "rollouts_rejoined": 1, "rollout_restarts": 2, "rollout_recovery_s": 46.6})
    again = fold(back, {**quiet, "rollouts_rejoined": 2, "rollout_restarts": 2})
    assert again == RolloutEngines(restarts=2, rejoins=3, last_recovery_seconds=46.6)
    later = fold(again, {**quiet, "rollout_restarts": 3, "rollout_recovery_s": 12.0})
    assert (later.restarts, later.rejoins, later.last_recovery_seconds) == (3, 3, 12.0)
    assert first.rejoins == 0 and hung.restarts == 1  # each call returns a new record


def test_a_restarted_rollout_sidecar_does_not_take_the_count_back() -> None:
    """A rollout's sidecar that itself restarted reports its engine's restarts from 0: the total never drops."""
    before = RolloutEngines(restarts=4, rejoins=1)
    after = fold(before, {"rollout_restarts": 1, "rollouts_rejoined": 1})
    assert (after.restarts, after.rejoins) == (4, 2)


def test_the_asynchronous_producers_counts_join_the_drivers() -> None:
    info = {"rollout_restarts": 1, "rollouts_rejoined": 1, "producer_rollout_restarts": 2,
            "producer_rollouts_rejoined": 1, "producer_rollout_recovery_s": 30.5}
    assert engines_after(None, info) == RolloutEngines(restarts=2, rejoins=2, last_recovery_seconds=30.5)
    assert engines_after(None, {"producer_rollout_restarts": 1}) == RolloutEngines(restarts=1)


def test_no_rollout_pool_reports_nothing() -> None:
    assert engines_after(None, {"reward_mean": 0.5, "kl_probes": 32}) is None
    kept = RolloutEngines(restarts=1, rejoins=1, last_recovery_seconds=3.0)
    assert engines_after(kept, {"reward_mean": 0.5}) is kept


def test_the_progress_record_carries_them_in_camel_case() -> None:
    record = Progress(phase="train", rollout_engines=RolloutEngines(restarts=2, rejoins=3, last_recovery_seconds=4.5))
    raw = json.loads(record.to_json())
    assert raw["rolloutEngines"] == {"restarts": 2, "rejoins": 3, "lastRecoverySeconds": 4.5}
    assert Progress.from_json(record.to_json()).rollout_engines == record.rollout_engines
    assert Progress.from_json(json.dumps({"phase": "train"})).rollout_engines is None  # an older driver's record
