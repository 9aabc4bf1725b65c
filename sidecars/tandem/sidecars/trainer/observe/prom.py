"""Prometheus metrics of the RL loop, served with the engine's on the driver's control API (/metrics).

Role: `LoopMetrics.observe(row)` takes each iteration's metrics row (the one written to
metrics.jsonl) and updates: tandem_trainer_iteration, _reward_mean, _kl, _switch_share (gauges),
tandem_trainer_phase_seconds{phase} and tandem_trainer_iteration_seconds (histograms),
tandem_trainer_completions_total and _completion_tokens_total (counters), _logprob_mismatch; the rollout/trainer
agreement (gauges): _mismatch_kl, _mismatch_ess, with algorithm.rolloutCorrection _is_ess and
_is_removed_share{unit,how} (tokens or sequences clipped or masked), _staleness_mean and, with
algorithm.mismatchGuard, _mismatch_guard_streak (consecutive iterations over its threshold); for stale
samples (partial or asynchronous rollouts) tandem_trainer_sample_staleness (histogram), _carried_share,
_wasted_tokens_total and _dropped_completions_total; tandem_trainer_peak_memory_bytes{phase,kind} (the
driver rank's peak RSS and, on a GPU, torch's peak allocation in each phase of the latest iteration); the
rollout pool's health: _rollouts (serving the latest iteration), _rollouts_dropped_total and
_prompts_resent_total, _rollout_restarts (the engine restarts the rollouts reported so far) and
_rollout_recovery_seconds (histogram: each iteration's longest recovery, failure to first generation); and
`observe_eval(result)` sets tandem_trainer_eval_pass_at_1 / _pass_at_k / _eval_iteration. Its registry is handed to
`checkpoint_engine.service.api.create_app`, which adds the engine's own collector. Callers: the trainer's
loop (`loop.start`, `loop.report`, `loop.evaluate`; driver rank only).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class LoopMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.iteration = Gauge("tandem_trainer_iteration", "Iterations completed", registry=r)
        self.reward = Gauge("tandem_trainer_reward_mean", "Mean reward of the latest iteration", registry=r)
        self.kl = Gauge("tandem_trainer_kl", "KL to the reference policy in the latest iteration", registry=r)
        self.switch = Gauge("tandem_trainer_switch_share",
                            "Share of the latest iteration spent switching (offload, onload, publish, sync, release)",
                            registry=r)
        self.phase = Histogram("tandem_trainer_phase_seconds", "Seconds of each phase of an iteration", ["phase"],
                               buckets=BUCKETS, registry=r)
        self.total = Histogram("tandem_trainer_iteration_seconds", "Seconds per iteration", buckets=BUCKETS,
                               registry=r)
        self.completions = Counter("tandem_trainer_completions", "Completions generated", registry=r)
        self.tokens = Counter("tandem_trainer_completion_tokens", "Completion tokens generated", registry=r)
        self.eval_pass1 = Gauge("tandem_trainer_eval_pass_at_1", "pass@1 of the latest held-out evaluation",
                                registry=r)
        self.eval_passk = Gauge("tandem_trainer_eval_pass_at_k", "pass@k (k = eval.samples) of the latest held-out "
                                "evaluation", registry=r)
        self.eval_iteration = Gauge("tandem_trainer_eval_iteration", "Iterations completed at the latest evaluation",
                                    registry=r)
        self.staleness = Histogram("tandem_trainer_sample_staleness", "Weight versions between the oldest segment "
                                   "of a trained completion and the weights it trains", buckets=(0, 1, 2, 4, 8, 16),
                                   registry=r)
        self.carried = Gauge("tandem_trainer_carried_share", "Share of the latest iteration's completions carried over "
                             "from earlier iterations (partial rollouts)", registry=r)
        self.wasted = Counter("tandem_trainer_wasted_tokens", "Completion tokens generated and then dropped as too "
                              "stale", registry=r)
        self.dropped = Counter("tandem_trainer_dropped_completions", "Completions dropped as too stale", registry=r)
        self.mismatch = Gauge("tandem_trainer_logprob_mismatch", "Mean |log p_rollout - log p_trainer| of the sampled "
                              "tokens in the latest iteration", registry=r)
        self.mismatch_kl = Gauge("tandem_trainer_mismatch_kl", "Mean k3 of p_trainer / p_rollout over the model's "
                                 "tokens in the latest iteration (KL(rollout || trainer) per token)", registry=r)
        self.mismatch_ess = Gauge("tandem_trainer_mismatch_ess", "Normalised effective sample size (sum w)^2 / (n sum "
                                  "w^2) of the token ratios p_trainer / p_rollout in the latest iteration", registry=r)
        self.is_ess = Gauge("tandem_trainer_is_ess", "Normalised effective sample size of the importance weights "
                            "algorithm.rolloutCorrection applied in the latest iteration", registry=r)
        self.is_removed = Gauge("tandem_trainer_is_removed_share", "Share of the latest iteration's tokens or "
                                "sequences whose importance weight was clipped or masked", ["unit", "how"], registry=r)
        self.staleness_mean = Gauge("tandem_trainer_staleness_mean", "Mean weight versions between a trained "
                                    "completion's oldest segment and the update, latest iteration", registry=r)
        self.guard_streak = Gauge("tandem_trainer_mismatch_guard_streak", "Consecutive iterations over "
                                  "algorithm.mismatchGuard's threshold", registry=r)

        self.rollouts = Gauge("tandem_trainer_rollouts", "Rollouts that served the latest iteration", registry=r)
        self.rollouts_dropped = Counter("tandem_trainer_rollouts_dropped", "Rollouts dropped from the pool as "
                                        "unhealthy, hung or stale (their prompts re-sent)", registry=r)
        self.prompts_resent = Counter("tandem_trainer_prompts_resent", "Prompts re-sent after their rollout was "
                                      "dropped", registry=r)
        self.rollout_restarts = Gauge("tandem_trainer_rollout_restarts", "vLLM engine restarts the rollouts "
                                      "reported so far (each rollout's, summed)", registry=r)
        self.rollout_recovery = Histogram("tandem_trainer_rollout_recovery_seconds", "The longest rollout recovery "
                                          "completed in an iteration: seconds from its engine found failed to its "
                                          "first generation after the restart", buckets=BUCKETS, registry=r)
        self.memory = Gauge("tandem_trainer_peak_memory_bytes", "Peak memory of the driver rank in each phase of the "
                            "latest iteration: kind rss (host, the kernel's peak) or cuda (torch's allocator)",
                            ["phase", "kind"], registry=r)

    def observe(self, row: dict[str, Any]) -> None:
        self.iteration.set(row["iteration"] + 1)
        for phase, mem in row.get("memory", {}).get("phases", {}).items():
            for kind, key in (("rss", "peak_rss_mib"), ("cuda", "cuda_peak_mib")):
                if key in mem:
                    self.memory.labels(phase, kind).set(float(mem[key]) * (1 << 20))
        for gauge, key in ((self.reward, "reward_mean"), (self.kl, "kl"), (self.switch, "switch_share"),
                           (self.mismatch, "mismatch_mean"), (self.mismatch_kl, "mismatch_kl"),
                           (self.mismatch_ess, "mismatch_ess"), (self.is_ess, "is_ess"),
                           (self.staleness_mean, "staleness_mean")):
            if row.get(key) is not None:
                gauge.set(float(row[key]))
        for unit in ("token", "seq"):
            for how in ("clipped", "masked"):
                if row.get(f"is_{unit}_{how}_frac") is not None:
                    self.is_removed.labels("sequence" if unit == "seq" else unit, how).set(
                        float(row[f"is_{unit}_{how}_frac"]))
        if "mismatch_guard" in row or row.get("mismatch_kl") is not None:
            self.guard_streak.set(float(row.get("mismatch_guard", {}).get("streak", 0)))
        for name, seconds in row.get("seconds", {}).items():
            self.phase.labels(name).observe(float(seconds))
        if row.get("total_seconds") is not None:
            self.total.observe(float(row["total_seconds"]))
        self.completions.inc(int(row.get("completions", 0)))
        for age, count in row.get("staleness_hist", {}).items():
            for _ in range(int(count)):
                self.staleness.observe(float(age))
        if row.get("carried_share") is not None:
            self.carried.set(float(row["carried_share"]))
        self.wasted.inc(int(row.get("wasted_tokens", 0)))
        self.dropped.inc(int(row.get("dropped_completions", 0)))
        self.tokens.inc(int(row.get("completion_tokens", 0)))
        if row.get("rollouts") is not None:
            self.rollouts.set(float(row["rollouts"]))
        self.rollouts_dropped.inc(int(row.get("rollouts_dropped", 0)))
        self.prompts_resent.inc(int(row.get("prompts_resent", 0)))
        if row.get("rollout_restarts") is not None:
            self.rollout_restarts.set(float(row["rollout_restarts"]))
        if row.get("rollout_recovery_s") is not None:
            self.rollout_recovery.observe(float(row["rollout_recovery_s"]))

    def observe_eval(self, result: dict[str, Any]) -> None:
        """A held-out evaluation's `EvalResult.row()`."""
        self.eval_pass1.set(float(result["pass_at_1"]))
        self.eval_passk.set(float(result["pass_at_k"]))
        self.eval_iteration.set(int(result["iteration"]))
