"""Prometheus metrics of the operator: each RLHFJob's state, and the health of reconciling.

Role: after every reconcile pass `record` sets the job's series from the status the pass wrote
(phase as a state set, iteration, weight version, reward, last sync, restarts, Kueue preemptions,
rollout-only pods replaced alone, the rollouts' vLLM engine restarts, rejoins and latest recovery, percent
done) and counts the pods
it created and deleted; `observe_pass` times passes and counts the failed ones; `forget` drops a
deleted job's series; `serve` exposes /metrics over HTTP (TANDEM_METRICS_PORT; the chart sets the
port and the pod's prometheus.io annotations). A private registry keeps them apart from any other
library's. Callers: `tandem.operator.runtime.handlers` (startup, the reconcile timer, the delete handler).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tandem.operator.policies.job_status import Phase
from tandem.operator.policies.plan import Plan

REGISTRY = CollectorRegistry(auto_describe=True)
JOB = ["namespace", "rlhfjob"]
PHASES: tuple[str, ...] = get_args(Phase)

phase = Gauge("tandem_rlhfjob_phase", "1 for the RLHFJob's current phase, 0 for the others",
              [*JOB, "phase"], registry=REGISTRY)
iteration = Gauge("tandem_rlhfjob_iteration", "Iterations the driver has reached", JOB, registry=REGISTRY)
weight_version = Gauge("tandem_rlhfjob_weight_version", "Newest published weight version", JOB, registry=REGISTRY)
reward_mean = Gauge("tandem_rlhfjob_reward_mean", "Mean reward of the latest iteration", JOB, registry=REGISTRY)
eval_pass1 = Gauge("tandem_rlhfjob_eval_pass_at_1", "pass@1 of the latest held-out evaluation", JOB, registry=REGISTRY)
sync_seconds = Gauge("tandem_rlhfjob_last_sync_seconds", "Seconds the latest weight sync took", JOB,
                     registry=REGISTRY)
restarts = Gauge("tandem_rlhfjob_restarts", "Gang restarts so far", JOB, registry=REGISTRY)
preemptions = Gauge("tandem_rlhfjob_preemptions", "Times Kueue stopped the job's pods", JOB, registry=REGISTRY)
replacements = Gauge("tandem_rlhfjob_rollout_replacements", "Rollout-only pods replaced alone (no gang restart)",
                     JOB, registry=REGISTRY)
engine_restarts = Gauge("tandem_rlhfjob_rollout_engine_restarts", "vLLM engine restarts the rollouts reported "
                        "since the driver started (status.rolloutEngines.restarts)", JOB, registry=REGISTRY)
rejoins = Gauge("tandem_rlhfjob_rollout_rejoins", "Dropped rollouts admitted again since the driver started", JOB,
                registry=REGISTRY)
recovery_seconds = Gauge("tandem_rlhfjob_rollout_recovery_seconds", "The latest rollout recovery: an engine found "
                         "dead or hung to its first generation after the restart", JOB, registry=REGISTRY)
progress = Gauge("tandem_rlhfjob_progress_percent", "Iterations done of algorithm.iterations, in percent", JOB,
                 registry=REGISTRY)
pods_created = Counter("tandem_pods_created", "Pods the operator created", registry=REGISTRY)
pods_deleted = Counter("tandem_pods_deleted", "Pods the operator deleted", registry=REGISTRY)
passes = Histogram("tandem_reconcile_seconds", "Duration of one reconcile pass of one RLHFJob",
                   buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=REGISTRY)
failed_passes = Counter("tandem_reconcile_errors", "Reconcile passes that raised (kopf retries them)",
                        ["error"], registry=REGISTRY)


def serve(port: int, address: str = "0.0.0.0") -> None:  # noqa: S104 - scraped from outside the pod
    """Serve /metrics on `port` in a background thread (0: do not serve)."""
    if port:
        start_http_server(port, addr=address, registry=REGISTRY)


@contextmanager
def observe_pass() -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    except Exception as e:
        failed_passes.labels(type(e).__name__).inc()
        raise
    finally:
        passes.observe(time.perf_counter() - start)


def record(namespace: str, name: str, plan: Plan) -> None:
    st = plan.status
    for p in PHASES:
        phase.labels(namespace, name, p).set(1.0 if st.phase == p else 0.0)
    iteration.labels(namespace, name).set(st.iteration)
    weight_version.labels(namespace, name).set(st.weight_version)
    restarts.labels(namespace, name).set(st.restarts)
    preemptions.labels(namespace, name).set(st.preemptions)
    replacements.labels(namespace, name).set(st.rollout_replacements)
    percent = None if st.progress is None else st.progress.percent
    pass1 = None if st.eval is None else st.eval.pass_at_1
    e = st.rollout_engines  # None until a driver reported its rollouts' engines
    for gauge, value in ((reward_mean, st.reward_mean), (sync_seconds, st.last_sync_seconds), (eval_pass1, pass1),
                         (progress, percent), (engine_restarts, None if e is None else e.restarts),
                         (rejoins, None if e is None else e.rejoins),
                         (recovery_seconds, None if e is None else e.last_recovery_seconds)):
        if value is None:  # nothing measured yet: no sample rather than a made-up 0
            _drop(gauge, (namespace, name))
        else:
            gauge.labels(namespace, name).set(value)
    pods_created.inc(len(plan.create))
    pods_deleted.inc(len(plan.delete))


def forget(namespace: str, name: str) -> None:
    """Drop every series of a deleted RLHFJob."""
    for p in PHASES:
        _drop(phase, (namespace, name, p))
    for gauge in (iteration, weight_version, reward_mean, sync_seconds, restarts, eval_pass1, preemptions, progress,
                  replacements, engine_restarts, rejoins, recovery_seconds):
        _drop(gauge, (namespace, name))


def _drop(gauge: Gauge, labels: tuple[str, ...]) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass
