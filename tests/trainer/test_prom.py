"""The loop's Prometheus metrics follow the metrics rows the driver records."""

from __future__ import annotations

from typing import Any

from tandem.sidecars.trainer.prom import LoopMetrics


def row(iteration: int, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"iteration": iteration, "reward_mean": 0.1 * iteration, "kl": 0.01,
                            "switch_share": 0.05, "completions": 64, "completion_tokens": 640,
                            "seconds": {"rollout": 1.5, "train": 0.5}, "total_seconds": 2.0}
    return base | extra


def test_rows_become_gauges_counters_and_histograms() -> None:
    m = LoopMetrics()
    m.observe(row(0))
    m.observe(row(1, kl=None, seconds={"rollout": 3.0}))
    get = m.registry.get_sample_value
    assert get("tandem_trainer_iteration") == 2  # iterations completed
    assert get("tandem_trainer_reward_mean") == 0.1
    assert get("tandem_trainer_kl") == 0.01  # a row without kl keeps the last value
    assert get("tandem_trainer_completions_total") == 128 and get("tandem_trainer_completion_tokens_total") == 1280
    assert get("tandem_trainer_phase_seconds_count", {"phase": "rollout"}) == 2
    assert get("tandem_trainer_phase_seconds_sum", {"phase": "rollout"}) == 4.5
    assert get("tandem_trainer_phase_seconds_count", {"phase": "train"}) == 1
    assert get("tandem_trainer_iteration_seconds_count") == 2
    assert get("tandem_trainer_phase_seconds_bucket", {"phase": "rollout", "le": "2.5"}) == 1
