"""The operator's Prometheus series follow each reconcile's plan; a deleted job's series go away."""

from __future__ import annotations

from wrappers import T0, JobWrapper, PodWrapper, StatusWrapper

from tandem.operator.policies.observe import PodState
from tandem.operator.policies.plan import Observation, Plan, decide
from tandem.operator.runtime import job_metrics
from tandem.spec.load import parse_job
from tandem.spec.progress import EvalSummary, Progress
from tandem.spec.status import JobStatus


def value(name: str, **labels: str) -> float | None:
    return job_metrics.REGISTRY.get_sample_value(name, labels)


def plan_for(name: str, st: JobStatus, pods: list[PodState], progress: Progress | None = None) -> Plan:
    job = parse_job(JobWrapper(name, "ns").replicas(2).obj())
    return decide(Observation(name=name, generation=1, job=job, spec_error=None, status=st, pods=pods,
                              progress=progress, now=T0))


def test_a_new_job_creates_pods_and_reports_pending() -> None:
    created = value("tandem_pods_created_total") or 0.0
    plan = plan_for("m-new", JobStatus(), [])
    job_metrics.record("ns", "m-new", plan)
    job = {"namespace": "ns", "rlhfjob": "m-new"}
    assert value("tandem_rlhfjob_phase", phase="Pending", **job) == 1.0
    assert sum(value("tandem_rlhfjob_phase", phase=p, **job) or 0.0 for p in job_metrics.PHASES) == 1.0
    assert value("tandem_pods_created_total") == created + 2
    assert value("tandem_rlhfjob_reward_mean", **job) is None  # nothing measured: no sample, not 0


def test_progress_and_restarts_show_then_forget_drops_them() -> None:
    running = [PodWrapper("m-run", i).running().state() for i in range(2)]
    progress = Progress(phase="train", iteration=7, iterations=10, weight_version=8, last_sync_seconds=1.5,
                        reward_mean=0.25)
    plan = plan_for("m-run", StatusWrapper().phase("Running").get(), running, progress)
    job_metrics.record("ns", "m-run", plan)
    job = {"namespace": "ns", "rlhfjob": "m-run"}
    assert value("tandem_rlhfjob_phase", phase="Running", **job) == 1.0
    assert value("tandem_rlhfjob_iteration", **job) == 7 and value("tandem_rlhfjob_weight_version", **job) == 8
    assert value("tandem_rlhfjob_reward_mean", **job) == 0.25
    assert value("tandem_rlhfjob_last_sync_seconds", **job) == 1.5
    assert value("tandem_rlhfjob_progress_percent", **job) == 70.0 and value("tandem_rlhfjob_preemptions", **job) == 0

    failed = [PodWrapper("m-run", 0).failed().state(), running[1]]
    plan = plan_for("m-run", plan.status, failed, progress)
    job_metrics.record("ns", "m-run", plan)
    assert value("tandem_rlhfjob_phase", phase="Restarting", **job) == 1.0
    assert value("tandem_rlhfjob_phase", phase="Running", **job) == 0.0
    assert value("tandem_rlhfjob_restarts", **job) == 1

    job_metrics.forget("ns", "m-run")
    assert value("tandem_rlhfjob_iteration", **job) is None and value("tandem_rlhfjob_preemptions", **job) is None
    assert all(value("tandem_rlhfjob_phase", phase=p, **job) is None for p in job_metrics.PHASES)
    job_metrics.forget("ns", "m-run")  # twice is harmless (the delete handler may retry)


def test_pass_timing_counts_failures_by_type() -> None:
    before = value("tandem_reconcile_seconds_count") or 0.0
    errors = value("tandem_reconcile_errors_total", error="RuntimeError") or 0.0
    with job_metrics.observe_pass():
        pass
    try:
        with job_metrics.observe_pass():
            raise RuntimeError("API server gone")
    except RuntimeError:
        pass
    assert value("tandem_reconcile_seconds_count") == before + 2
    assert value("tandem_reconcile_errors_total", error="RuntimeError") == errors + 1


def test_eval_pass_at_1_shows_once_evaluated_and_is_forgotten() -> None:
    running = [PodWrapper("m-eval", i).running().state() for i in range(2)]
    job = {"namespace": "ns", "rlhfjob": "m-eval"}
    plan = plan_for("m-eval", StatusWrapper().phase("Running").get(), running,
                    Progress(phase="train", iteration=1, iterations=10))
    job_metrics.record("ns", "m-eval", plan)
    assert value("tandem_rlhfjob_eval_pass_at_1", **job) is None  # not evaluated yet: no sample, not 0
    summary = EvalSummary(iteration=0, weight_version=1, pass_at_1=0.0, pass_at_k=0.25, k=4, prompts=8)
    plan = plan_for("m-eval", plan.status, running, Progress(phase="train", iteration=2, eval=summary))
    job_metrics.record("ns", "m-eval", plan)
    assert value("tandem_rlhfjob_eval_pass_at_1", **job) == 0.0  # a measured 0 is a sample
    better = summary.model_copy(update={"iteration": 5, "pass_at_1": 0.625})
    plan = plan_for("m-eval", plan.status, running, Progress(phase="train", iteration=6, eval=better))
    job_metrics.record("ns", "m-eval", plan)
    assert value("tandem_rlhfjob_eval_pass_at_1", **job) == 0.625
    job_metrics.forget("ns", "m-eval")
    assert value("tandem_rlhfjob_eval_pass_at_1", **job) is None
