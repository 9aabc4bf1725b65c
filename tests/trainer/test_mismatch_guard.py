"""algorithm.mismatchGuard's decisions (a pure function of the iterations' metrics) and what the loop does
with each (warn, pause, fail), on a stand-in for the trainer context: no engine, no etcd."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples
from tandem.sidecars.trainer.loop.phases.mismatch_guard import Guard, MismatchGuardTripped, Verdict, enforce
from tandem.sidecars.trainer.loop.phases.train import train
from tandem.sidecars.trainer.observe.prom import LoopMetrics
from tandem.spec.load import parse_job
from tandem.spec.models import Algorithm
from tandem.spec.rollout_correction import MismatchGuard


def guard(**fields: Any) -> Guard:
    return Guard(MismatchGuard.model_validate({"threshold": 0.01, **fields}))


def actions(g: Guard, values: Sequence[float | None], key: str = "mismatch_kl") -> list[str]:
    return [g.observe(i, {} if v is None else {key: v}).action for i, v in enumerate(values)]


def test_fires_after_n_consecutive_iterations_over_the_threshold() -> None:
    g = guard(iterations=3, action="fail")
    assert actions(g, [0.02, 0.03, 0.05, 0.04]) == ["ok", "ok", "fail", "fail"]
    v = guard(iterations=3, action="fail")
    for i, x in enumerate([0.001, 0.02, 0.03]):
        v.observe(i + 4, {"mismatch_kl": x})
    verdict = v.observe(7, {"mismatch_kl": 0.05})
    assert verdict == Verdict("fail", "algorithm.mismatchGuard: mismatch_kl 0.05 > 0.01 in 3 consecutive iterations "
                                      "(iterations 5-7); action fail", 3)


def test_a_healthy_run_never_fires_and_one_good_iteration_restarts_the_count() -> None:
    g = guard(iterations=2, action="pause")
    healthy = [1e-5, 3e-5, 0.0, 8e-5, 1e-4] * 20
    assert set(actions(g, healthy)) == {"ok"}
    # spikes that never last `iterations` in a row: each one alone, at the threshold itself (not over)
    assert set(actions(g, [0.02, 0.001, 0.5, 0.01, 0.02, 1e-6, 0.03])) == {"ok"}
    # an iteration without a measurement (no rollout log-probs) ends a streak too
    assert actions(guard(iterations=2, action="pause"), [0.02, None, 0.02, 0.02]) == ["ok", "ok", "ok", "pause"]


def test_the_metric_named_is_the_one_read() -> None:
    g = guard(metric="mismatch", threshold=0.1, iterations=1)
    assert actions(g, [0.5], key="mismatch_kl") == ["ok"]  # another metric: no reading
    assert actions(g, [0.05, 0.2], key="mismatch_mean") == ["ok", "warn"]
    assert MismatchGuard(threshold=1.0).key == "mismatch_kl"


def test_the_spec_refuses_what_does_not_apply() -> None:
    with pytest.raises(ValueError, match="threshold"):
        Algorithm.model_validate({"mismatchGuard": {"iterations": 3}})  # no threshold
    with pytest.raises(ValueError, match="mismatchGuard: applies to grpo and ppo"):
        Algorithm.model_validate({"name": "dpo", "mismatchGuard": {"threshold": 0.1}})
    with pytest.raises(ValueError, match="greater than 0"):
        Algorithm.model_validate({"mismatchGuard": {"threshold": 0}})
    assert "mismatch guard mismatch_kl > 0.01 x3: warn" in Algorithm.model_validate(
        {"mismatchGuard": {"threshold": 0.01}}).summary()


class Loop:
    """The trainer context as `enforce` sees it, and its phase report: one rank, its reports recorded."""

    def __init__(self, driver: bool = True) -> None:
        self.driver = driver
        self.reports: list[tuple[str, int, str]] = []
        self.broadcasts: list[Any] = []

    @property
    def is_driver(self) -> bool:
        return self.driver

    def broadcast(self, obj: Any) -> Any:
        self.broadcasts.append(obj)
        return obj

    def report(self, phase: Any, iteration: int, version: int, *, reward: float | None = None,
               message: str = "") -> None:
        self.reports.append((phase, iteration, message))


def test_warn_logs_records_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    ctx, g = Loop(), guard(iterations=1, action="warn")
    info: dict[str, Any] = {"mismatch_kl": 0.002}
    assert enforce(ctx, g, 0, 1, info, report=ctx.report).action == "ok" and "mismatch_guard" not in info
    info = {"mismatch_kl": 0.2}
    with caplog.at_level("WARNING"):
        assert enforce(ctx, g, 1, 2, info, report=ctx.report).action == "warn"
    assert "mismatch_kl 0.2 > 0.01" in caplog.text and info["mismatch_guard"]["action"] == "warn"
    assert ctx.reports == []  # the loop goes on: its next report carries the warning (ctx.last_guard)


def test_fail_raises_with_the_reason_on_every_rank_after_recording_the_row() -> None:
    for driver in (True, False):
        ctx, rows = Loop(driver), list[dict[str, Any]]()
        g = guard(iterations=1, action="fail") if driver else None
        if not driver:  # the other ranks learn the driver's verdict from the broadcast
            ctx.broadcast = lambda obj: Verdict("fail", "algorithm.mismatchGuard: x", 1)  # type: ignore[method-assign]
        info: dict[str, Any] = {"mismatch_kl": 1.0}
        with pytest.raises(MismatchGuardTripped, match="algorithm.mismatchGuard"):
            enforce(ctx, g, 4, 5, info, report=ctx.report, record=lambda: rows.append(dict(info)))  # noqa: B023
        assert rows == [info] and info["mismatch_guard"]["action"] == "fail"  # metrics.jsonl has the iteration


def test_pause_reports_why_holds_then_fails_saying_so() -> None:
    ctx, slept, recorded = Loop(), list[float](), list[int]()
    with pytest.raises(MismatchGuardTripped, match="paused 0.05 h without being suspended"):
        enforce(ctx, guard(iterations=1, action="pause"), 3, 4, {"mismatch_kl": 0.5, "reward_mean": 0.3},
                report=ctx.report, record=lambda: recorded.append(len(slept)), sleep=slept.append, limit=180.0)
    assert recorded == [0]  # the row is written before the wait
    (phase, iteration, message), = ctx.reports
    assert phase == "paused" and iteration == 3
    assert message.startswith("paused: algorithm.mismatchGuard: mismatch_kl 0.5 > 0.01") and "spec.suspend" in message
    assert sum(slept) == 180.0 and ctx.broadcasts[-1] is None  # the other ranks are released at the end


def test_prometheus_shows_the_agreement_and_the_streak() -> None:
    m = LoopMetrics()
    m.observe({"iteration": 0, "mismatch_kl": 0.004, "mismatch_ess": 0.97, "is_ess": 0.9, "staleness_mean": 0.5,
               "is_token_masked_frac": 0.1, "is_seq_masked_frac": 0.25,
               "mismatch_guard": {"action": "ok", "streak": 2}})
    get = m.registry.get_sample_value
    assert get("tandem_trainer_mismatch_kl") == 0.004 and get("tandem_trainer_mismatch_ess") == 0.97
    assert get("tandem_trainer_is_ess") == 0.9 and get("tandem_trainer_staleness_mean") == 0.5
    assert get("tandem_trainer_is_removed_share", {"unit": "sequence", "how": "masked"}) == 0.25
    assert get("tandem_trainer_is_removed_share", {"unit": "token", "how": "masked"}) == 0.1
    assert get("tandem_trainer_mismatch_guard_streak") == 2
    m.observe({"iteration": 1, "mismatch_kl": 0.001})  # back under the threshold: no guard entry, streak 0
    assert get("tandem_trainer_mismatch_guard_streak") == 0 and get("tandem_trainer_mismatch_kl") == 0.001


class Steps:
    """An engine whose optimizer steps report given metrics, as the engines do (means over micro-batches)."""

    def __init__(self, rows: list[dict[str, float]]) -> None:
        self.rows = rows

    def train_step(self, part: Any, loss: Any, reduction: str) -> dict[str, float]:
        return self.rows.pop(0)


def test_the_loop_reports_the_first_steps_agreement_as_the_batchs_ratios() -> None:
    """`train.train`: the rc_ sums of the first optimizer step (before any update) become mismatch_kl,
    the ESS and the shares; the other metrics are the steps' mean; no rc_ entry is left in the row."""
    samples = [Sample([1], [2, 3], group=0, reward=1.0), Sample([1], [4], group=0, reward=0.0)]
    batch = pack_samples(samples, 3)  # a row each: two optimizer steps of one sample
    assert batch.num_rows == 2
    batch.stats = {"reward_mean": 0.5}
    first = {"loss": 1.0, "mismatch_max": 0.5, "rc_gap": 0.8, "rc_tokens": 4.0, "rc_k3": 0.08, "rc_ratio": 4.0,
             "rc_ratio_sq": 5.0, "rc_w": 3.0, "rc_w_sq": 3.0, "rc_tok_clipped": 0.0, "rc_tok_masked": 1.0,
             "rc_seqs": 2.0, "rc_seq_clipped": 0.0, "rc_seq_masked": 1.0}
    later = {**first, "loss": 3.0, "mismatch_max": 2.0, "rc_gap": 3.6, "rc_k3": 4.0}  # after an update: not the gap
    doc = {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "t"},
           "spec": {"model": {"path": "/m"}, "dataset": {"path": "/d.jsonl"},
                    "rewards": [{"type": "answerMatch"}], "trainer": {"globalBatchSize": 1, "microBatchSize": 1}}}
    ctx = SimpleNamespace(job=parse_job(doc), engine=Steps([first, later]), critic=None,
                          algorithm=SimpleNamespace(prepare=lambda s, budget: batch, loss=None),
                          token_budget=lambda s: 3, last_kl=None)
    out = train(ctx, samples)  # type: ignore[arg-type]
    assert out["loss"] == 2.0 and out["prepare_reward_mean"] == 0.5  # the two steps' mean
    assert out["mismatch_mean"] == 0.2 and out["mismatch_kl"] == pytest.approx(0.02)  # the first step's
    assert out["mismatch_max"] == 0.5 and out["optimizer_steps"] == 2.0
    assert out["mismatch_ess"] == pytest.approx(16 / 20) and out["is_ess"] == pytest.approx(9 / 12)
    assert out["is_token_masked_frac"] == 0.25 and out["is_seq_masked_frac"] == 0.5
    assert not [k for k in out if k.startswith("rc_")]
