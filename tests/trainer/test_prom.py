"""The loop's Prometheus metrics follow the metrics rows the driver records."""

from __future__ import annotations

from typing import Any

from tandem.sidecars.trainer.observe.prom import LoopMetrics


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


def test_rows_set_the_logprob_mismatch_and_keep_it_when_absent() -> None:
    m = LoopMetrics()
    get = m.registry.get_sample_value
    m.observe(row(0))
    assert get("tandem_trainer_logprob_mismatch") == 0.0  # never measured yet: the gauge's initial 0
    m.observe(row(1, mismatch_mean=0.031, mismatch_max=0.9, tis_clip_frac=0.02))
    assert get("tandem_trainer_logprob_mismatch") == 0.031  # the mean, not the max
    m.observe(row(2))  # e.g. rollouts without log-probs: the last value stays
    assert get("tandem_trainer_logprob_mismatch") == 0.031
    m.observe(row(3, mismatch_mean=0.004))
    assert get("tandem_trainer_logprob_mismatch") == 0.004


def test_eval_results_become_gauges() -> None:
    from tandem.sidecars.trainer.loop.held_out import EvalResult

    m = LoopMetrics()
    get = m.registry.get_sample_value
    first = EvalResult(iteration=0, version=1, prompts=8, samples=4, pass_at_1=0.125, pass_at_k=0.375,
                       reward_mean=0.125, seconds=2.0)
    m.observe_eval(first.row())
    assert (get("tandem_trainer_eval_pass_at_1"), get("tandem_trainer_eval_pass_at_k"),
            get("tandem_trainer_eval_iteration")) == (0.125, 0.375, 0)
    m.observe(row(9))  # an iteration's row leaves the evaluation alone
    assert get("tandem_trainer_eval_pass_at_1") == 0.125
    later = EvalResult(iteration=10, version=11, prompts=8, samples=4, pass_at_1=0.5, pass_at_k=0.75,
                       reward_mean=0.5, seconds=2.0)
    m.observe_eval(later.row())
    assert (get("tandem_trainer_eval_pass_at_1"), get("tandem_trainer_eval_pass_at_k"),
            get("tandem_trainer_eval_iteration")) == (0.5, 0.75, 10)
    assert get("tandem_trainer_iteration") == 10  # observe_eval does not move the loop's iteration


def test_phase_memory_becomes_gauges_in_bytes() -> None:
    m = LoopMetrics()
    memory = {"peak_rss_mib": 3.0, "phases": {"train": {"peak_rss_mib": 3.0, "rss_mib": 1.0},
                                              "inference": {"peak_rss_mib": 2.0, "rss_mib": 1.0, "cuda_peak_mib": 0.5}}}
    m.observe(row(0, memory=memory))
    get = m.registry.get_sample_value
    assert get("tandem_trainer_peak_memory_bytes", {"phase": "train", "kind": "rss"}) == 3 * 2**20
    assert get("tandem_trainer_peak_memory_bytes", {"phase": "inference", "kind": "cuda"}) == 2**19
    assert get("tandem_trainer_peak_memory_bytes", {"phase": "train", "kind": "cuda"}) is None
